"""The CDK app's stacks (app.py, `cdk deploy -c ...`) and the one construct from them that another
app imports: ServiceCatalogPortfolio. It loads lazily, so that the dl-launcher CLI's verbs, which
read dl_stacks.settings, import no aws_cdk."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {"ServiceCatalogPortfolio": ".portfolio"}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the same names, for type checkers and IDEs (nothing is imported at run time)
    from .portfolio import ServiceCatalogPortfolio as ServiceCatalogPortfolio


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dl_stacks' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
