"""Instance facts for constructs: always the selector's catalog, never a table of our own."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError
from dl_selector.facts import InstanceFacts

if TYPE_CHECKING:
    import aws_cdk.aws_ec2 as ec2

# A name ("p5.48xlarge"), aws-cdk-lib's ec2.InstanceType (as every aws-cdk-lib construct takes
# it), or the catalog's facts.
InstanceLike = Union[str, "ec2.InstanceType", InstanceFacts]


def resolve(instance: InstanceLike, catalog_path: Optional[str] = None) -> InstanceFacts:
    """An instance type name or ec2.InstanceType (unknown ones raise a UserError naming the
    closest), or facts as given."""
    if isinstance(instance, InstanceFacts):
        return instance
    if isinstance(instance, str):
        name = instance
    elif callable(getattr(instance, "to_string", None)):
        name = instance.to_string()  # ec2.InstanceType("p5.48xlarge") -> "p5.48xlarge"
    else:
        raise UserError(f"instance type {instance!r}: a name such as 'p5.48xlarge', an ec2.InstanceType "
                        "or InstanceFacts")
    return load_catalog(catalog_path).get(name)
