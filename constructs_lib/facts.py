"""Instance facts for constructs: always the selector's catalog, never a table of our own."""
from __future__ import annotations

from typing import Optional, Union

from selector.catalog import load_catalog
from selector.facts import InstanceFacts

InstanceLike = Union[str, InstanceFacts]


def resolve(instance: InstanceLike, catalog_path: Optional[str] = None) -> InstanceFacts:
    """An instance type name (unknown names raise a UserError naming the closest) or facts as given."""
    if isinstance(instance, InstanceFacts):
        return instance
    return load_catalog(catalog_path).get(instance)
