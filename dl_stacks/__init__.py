"""The CDK app's stacks (app.py, `cdk deploy -c ...`) and the one construct from them that another
app imports: ServiceCatalogPortfolio. It loads on first use, so that the dl-launcher CLI's verbs,
which read dl_stacks.settings, import no aws_cdk."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ServiceCatalogPortfolio"]

if TYPE_CHECKING:  # the same name, for type checkers and IDEs (nothing is imported at run time)
    from .portfolio import ServiceCatalogPortfolio as ServiceCatalogPortfolio


def __getattr__(name: str) -> Any:
    if name == "ServiceCatalogPortfolio":
        from .portfolio import ServiceCatalogPortfolio
        return ServiceCatalogPortfolio
    raise AttributeError(f"module 'dl_stacks' has no attribute {name!r}")
