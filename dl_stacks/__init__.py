"""The CDK app's stacks (app.py, `cdk deploy -c ...`) and what another app imports from them:
ServiceCatalogPortfolio and, for a shared portfolio, PortfolioLaunchRoleStack. They load on first
use, so that the dl-launcher CLI's verbs, which read dl_stacks.settings, import no aws_cdk."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["PortfolioLaunchRoleStack", "ServiceCatalogPortfolio"]

if TYPE_CHECKING:  # the same names, for type checkers and IDEs (nothing is imported at run time)
    from .portfolio import PortfolioLaunchRoleStack as PortfolioLaunchRoleStack
    from .portfolio import ServiceCatalogPortfolio as ServiceCatalogPortfolio


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import portfolio
        return getattr(portfolio, name)
    raise AttributeError(f"module 'dl_stacks' has no attribute {name!r}")
