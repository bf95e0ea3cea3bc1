"""Records: the part of `dataclasses` the selector uses, without its start-up cost.

`python -m dl_selector recommend` spent 30 ms of its ~55 ms over a bare interpreter in `dataclasses`:
11 ms to import it (it imports `inspect`) and 19 ms to generate sixteen classes' methods, on every
run (bench/selector_speed.py). A record's `__init__` is still generated, because rankings make a
candidate and an estimate per instance type; `__repr__`, `__eq__`, `__hash__` and the frozen guard
are shared functions. The selector's own records take their `__init__` from record_inits.py, the
same source generated ahead of time (scripts/build_record_inits.py) and byte-compiled with the
package: compiling sixteen of them cost every cold start ~6 ms (issue 39 item 7). One is used only
when its source is exactly what this module would generate; any other is compiled here, as before.

Supported: annotated fields with defaults or `field(default=, default_factory=, repr=, compare=)`,
`frozen=True`, `eq=False`, `__post_init__`, and `asdict`, `replace`, `fields` as in `dataclasses`.
Not supported (and not used): inheritance between records, `init=False`, `InitVar`, `ClassVar`.
"""
from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs 3 ms at start; type checkers still see a dataclass-like decorator
    from typing import Any, Callable, TypeVar, dataclass_transform, overload

    T = TypeVar("T")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record."""


class Field:
    __slots__ = ("name", "type", "default", "default_factory", "repr", "compare")

    def __init__(self, default: Any = MISSING, default_factory: Any = MISSING, repr: bool = True,
                 compare: bool = True) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot give both default and default_factory")
        self.name = ""
        self.type = ""  # the annotation as written (a string: modules use postponed annotations)
        self.default = default
        self.default_factory = default_factory
        self.repr = repr
        self.compare = compare

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, type={self.type!r}, default={self.default!r})"


def field(*, default: Any = MISSING, default_factory: Any = MISSING, repr: bool = True, compare: bool = True) -> Any:
    return Field(default, default_factory, repr, compare)


def _init_source(fs: list[Field], frozen: bool, post_init: bool) -> str:
    params, body = ["self"], []
    seen_default = False
    for f in fs:
        if f.default is not MISSING:
            params.append(f"{f.name}=_d_{f.name}")
            seen_default = True
        elif f.default_factory is not MISSING:
            params.append(f"{f.name}=_MISSING")
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default field {f.name!r} follows a default field")
        else:
            params.append(f.name)
        value = f"_f_{f.name}() if {f.name} is _MISSING else {f.name}" if f.default_factory is not MISSING else f.name
        body.append(f"_set(self, {f.name!r}, {value})" if frozen else f"self.{f.name} = {value}")
    if post_init:
        body.append("self.__post_init__()")
    return f"def __init__({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body or ["pass"])


def _repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in self.__record_fields__ if f.repr)
    return f"{type(self).__qualname__}({shown})"


def _key(self: Any) -> tuple:
    return tuple(getattr(self, f.name) for f in self.__record_fields__ if f.compare)


def _eq(self: Any, other: object) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _key(self) == _key(other)


def _hash(self: Any) -> int:
    return hash(_key(self))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


GENERATED: dict[str, str] = {}  # "module.Class": the __init__ source made for it (what the build script writes)
_AHEAD: list = []


def _ahead_of_time() -> Any:
    """dl_selector.record_inits, or None where it cannot be imported."""
    if not _AHEAD:
        try:
            from . import record_inits
        except ImportError:
            record_inits = None
        _AHEAD.append(record_inits)
    return _AHEAD[0]


def factory_source(key: str, source: str) -> str:
    """A module-level function that binds `source`'s names from the scope _make passes and returns
    the __init__ it defines: the same function exec would make, its names closed over, not global."""
    names = sorted(set(re.findall(r"\b(_MISSING|_set|_[df]_[A-Za-z0-9_]+)\b", source)))
    binds = "".join(f"    {n} = scope[{n!r}]\n" for n in names)
    body = "".join(f"    {line}\n" for line in source.splitlines())
    return f"def {factory_name(key)}(scope):\n{binds}{body}    return __init__\n"


def factory_name(key: str) -> str:
    return "_" + key.replace(".", "_")


def _make(cls: type, frozen: bool, eq: bool) -> type:
    fs = []
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name, f.type = name, annotation
        fs.append(f)
        if isinstance(value, Field):  # the class attribute is the default, as in dataclasses
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
    scope: dict[str, Any] = {"_MISSING": MISSING, "_set": object.__setattr__}
    for f in fs:
        scope[f"_d_{f.name}"] = f.default
        scope[f"_f_{f.name}"] = f.default_factory
    source = _init_source(fs, frozen, hasattr(cls, "__post_init__"))
    key = f"{cls.__module__}.{cls.__qualname__}"
    GENERATED[key] = source
    ahead = _ahead_of_time()
    if ahead is not None and ahead.SOURCES.get(key) == source:
        init = ahead.FACTORIES[key](scope)
    else:
        exec(source, scope)
        init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[misc]
    cls.__record_fields__ = tuple(fs)  # type: ignore[attr-defined]
    cls.__match_args__ = tuple(f.name for f in fs)  # type: ignore[attr-defined]
    if "__repr__" not in cls.__dict__:
        cls.__repr__ = _repr  # type: ignore[assignment]
    if eq:
        cls.__eq__ = _eq  # type: ignore[assignment]
        cls.__hash__ = _hash if frozen else None  # type: ignore[assignment]
    if frozen:
        cls.__setattr__ = _frozen_setattr  # type: ignore[assignment]
        cls.__delattr__ = _frozen_delattr  # type: ignore[assignment]
    return cls


if TYPE_CHECKING:
    # Both spellings keep the class's own type (a decorator returning Any would make every record
    # class Any to a type checker, and with it the selector's whole public API).
    @overload
    @dataclass_transform(field_specifiers=(field, Field))
    def record(cls: type[T], /) -> type[T]: ...
    @overload
    def record(*, frozen: bool = False, eq: bool = True) -> Callable[[type[T]], type[T]]: ...
    def record(cls: Any = None, /, *, frozen: bool = False, eq: bool = True) -> Any: ...
else:
    def record(cls=None, /, *, frozen=False, eq=True):
        """@record or @record(frozen=True): a class whose annotated names are its fields."""
        if cls is None:
            return lambda c: _make(c, frozen, eq)
        return _make(cls, frozen, eq)


def is_record(obj: object) -> bool:
    return hasattr(obj if isinstance(obj, type) else type(obj), "__record_fields__")


def fields(obj: Any) -> tuple[Field, ...]:
    """The fields, in order, of a record or record class."""
    try:
        return obj.__record_fields__
    except AttributeError:
        raise TypeError(f"fields() needs a record or record class, not {type(obj).__name__}") from None


def _plain(v: Any) -> Any:
    if is_record(v) and not isinstance(v, type):
        return asdict(v)
    if isinstance(v, tuple) and hasattr(v, "_fields"):  # a named tuple takes its items positionally
        return type(v)(*(_plain(x) for x in v))
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    if isinstance(v, dict):
        return type(v)((_plain(k), _plain(x)) for k, x in v.items())
    return v  # the selector's field values are immutable scalars


def asdict(obj: Any) -> dict[str, Any]:
    """The record as a dict, nested records, lists, tuples and dicts converted too (a dataclass
    goes to dataclasses.asdict, so callers holding either need one function)."""
    if not is_record(obj):
        import dataclasses
        return dataclasses.asdict(obj)
    return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of the record with `changes` applied (through __init__, so __post_init__ runs); a
    dataclass goes to dataclasses.replace."""
    if not is_record(obj):
        import dataclasses
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}
    unknown = sorted(set(changes) - values.keys())
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {unknown[0]!r}")
    values.update(changes)
    return type(obj)(**values)  # type: ignore[return-value]
