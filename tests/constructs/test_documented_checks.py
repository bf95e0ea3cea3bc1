"""Every check docs/constructs.md promises ("Checks at synth time") fires, at the level the page
gives, through the public constructs as a user calls them (issue 26: a documented placement-group
check did not). A row added to the page without a case here fails, and so does a case the page
no longer lists."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import pytest
from aws_cdk.assertions import Annotations, Match

from constructs_lib import (ClusterCapacity, NodeOptions, ClusterObservability, CodeAsset, GpuLaunchTemplate, InstanceOption,
                            InterruptionAlerts, JobDefinition)
from dl_selector.errors import UserError

PAGE = Path(__file__).resolve().parents[2] / "docs" / "constructs.md"


def documented() -> dict[str, str]:
    """{check id: level} from the page's table."""
    text = PAGE.read_text()
    section = text[text.index("## Checks at synth time"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| (\w+) \|", section, re.M)
    assert rows, "the checks table is gone from docs/constructs.md"
    return dict(rows)


def _stack(azs: int = 1) -> tuple[cdk.Stack, ec2.IVpc]:
    stack = cdk.Stack(cdk.App(), "Checks", env=cdk.Environment(account="111111111111", region="us-east-1"))
    zones = ["us-east-1a", "us-east-1b"][:azs]
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-12345678", availability_zones=zones,
                                      private_subnet_ids=[f"subnet-0000000{i}" for i in range(azs)])
    return stack, vpc


def _warnings(stack: cdk.Stack) -> str:
    """dl-launcher's own warnings (CDK's about imported subnets are not the subject here)."""
    found = Annotations.from_stack(stack).find_warning("*", Match.string_like_regexp(r"\[ack: dl-launcher:"))
    return "\n".join(str(w.entry.data) for w in found)


def _template(**kw) -> tuple[str, str]:
    stack, vpc = _stack(kw.pop("azs", 1))
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, **kw)
    notes = [str(f) for f in node.findings if f.level == "note"]
    warnings = _warnings(stack)
    return ("warning", warnings) if warnings else ("note", "\n".join(notes)) if notes else ("none", "")


def _capacity(options, *, nodes: int = 1, **kw) -> tuple[str, str]:
    stack, vpc = _stack()
    alerts = InterruptionAlerts(stack, "Alerts")
    import aws_cdk.aws_s3 as s3
    ClusterCapacity(stack, "Cap", vpc=vpc, cluster="c", nodes=nodes, options=options,
                    state_bucket=s3.Bucket(stack, "State"), state_key="_control/c/capacity.json",
                    log_group=alerts.log_group, **kw)
    return "warning", _warnings(stack)


def _idle_guard_unsupported() -> tuple[str, str]:
    stack, vpc = _stack()
    alerts = InterruptionAlerts(stack, "Alerts")
    import aws_cdk.aws_s3 as s3
    cap = ClusterCapacity(stack, "Cap", vpc=vpc, cluster="c", options=[InstanceOption("g4ad.xlarge", 0.4)],
                          node_options=NodeOptions(machine_image=ec2.MachineImage.latest_amazon_linux2023()),
                          state_bucket=s3.Bucket(stack, "State"), state_key="_control/c/capacity.json",
                          log_group=alerts.log_group)
    ClusterObservability(stack, "Obs", capacity=cap, log_group=alerts.log_group)
    return "warning", _warnings(stack)


def _user_data_too_large() -> tuple[str, str]:
    stack, vpc = _stack()
    GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g5.xlarge").add_user_data("echo " + "x" * 17000)
    cdk.App.of(stack).synth()  # the check runs at synth, raised through jsii
    return "none", ""


def _code(tmp: Path, **kw) -> tuple[str, str]:
    stack, _ = _stack()
    CodeAsset(stack, "Code", path=str(tmp), **kw)
    return "none", ""


def _code_too_large(tmp: Path) -> tuple[str, str]:
    for i in range(3):
        (tmp / f"f{i}.py").write_text("print()\n")
    return _code(tmp, max_files=2)


def _code_link_out(tmp: Path) -> tuple[str, str]:
    (tmp / "train.py").write_text("print()\n")
    os.symlink("/etc/hostname", tmp / "host")
    return _code(tmp)


def _job(**kw) -> tuple[str, str]:
    stack, _ = _stack()
    JobDefinition(stack, "Job", cluster="c", command="python train.py", **kw)
    return "none", ""


IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:1"
# id -> a user's mistake that must trip it (tmp is an empty directory of the test's own).
CASES: dict[str, Callable[[Path], tuple[str, str]]] = {
    "efa-unsupported": lambda tmp: _template(instance_type="g5.xlarge", efa=True),
    "multi-node-without-efa": lambda tmp: _template(instance_type="g5.xlarge", multi_node=True),
    "placement-group-several-azs": lambda tmp: _template(instance_type=ec2.InstanceType("p4d.24xlarge"),
                                                         multi_node=True, azs=2),
    "public-ip-several-interfaces": lambda tmp: _template(instance_type="p5.48xlarge", multi_node=True,
                                                          associate_public_ip=True),
    "ami-architecture-mismatch": lambda tmp: _template(instance_type="p5.48xlarge", ami_architecture="arm64"),
    "unknown-instance-type": lambda tmp: _template(instance_type="p5.48xlarg"),
    "raid-without-instance-store": lambda tmp: _template(instance_type="g5g.xlarge"),
    "retired-type": lambda tmp: _template(instance_type="g3.4xlarge"),
    "alternate-not-interchangeable": lambda tmp: _capacity(
        [InstanceOption("p5.48xlarge", 40.0), InstanceOption(ec2.InstanceType("p5en.48xlarge"), 45.0)], nodes=2),
    "multi-node-alternate-without-efa": lambda tmp: _capacity(
        [InstanceOption("g5.8xlarge", 3.0), InstanceOption("g5.4xlarge", 2.0)], nodes=2, interchange="same-count"),
    "option-unused": lambda tmp: _capacity(
        [InstanceOption("p5.48xlarge", 40.0), InstanceOption("p5.48xlarge", None)], max_price=50.0),
    "idle-guard-unsupported": lambda tmp: _idle_guard_unsupported(),
    "user-data-too-large": lambda tmp: _user_data_too_large(),
    "code-too-large": _code_too_large,
    "code-link-out-of-directory": _code_link_out,
    "reserved-env-name": lambda tmp: _job(env={"RANK": "3"}),
    "image-with-setup": lambda tmp: _job(image=IMAGE, setup="pip install -r requirements.txt"),
}
# What the message must say for each, so that a different check firing does not count.
SAYS = {
    "efa-unsupported": "EfaSupported", "multi-node-without-efa": "MultiNodeNeedsEfa",
    "placement-group-several-azs": "would span 2 AZs", "public-ip-several-interfaces": "public IP",
    "ami-architecture-mismatch": "arm64", "unknown-instance-type": "p5.48xlarge",
    "raid-without-instance-store": "RaidNeedsInstanceStore", "retired-type": "retired",
    "alternate-not-interchangeable": "cannot replace p5.48xlarge", "multi-node-alternate-without-efa": "g5.4xlarge",
    "option-unused": "will not be used", "idle-guard-unsupported": "report neither",
    "user-data-too-large": "16384-byte limit", "code-too-large": "files",
    "code-link-out-of-directory": "host", "reserved-env-name": "RANK", "image-with-setup": "image and setup",
}


def test_the_page_and_the_cases_name_the_same_checks():
    assert sorted(documented()) == sorted(CASES)


@pytest.mark.parametrize("check", sorted(CASES))
def test_each_documented_check_fires_at_its_level(check, tmp_path):
    level = documented()[check]
    try:
        got, message = CASES[check](tmp_path)
    except UserError as e:
        got, message = "error", str(e)
        assert "\n" not in message, f"{check}: an error is one line: {message}"
    except RuntimeError as e:  # a construct's own check at synth, raised through jsii
        got, message = "error", str(e)
    assert got == level, f"{check}: documented as {level}, fired as {got}: {message}"
    assert SAYS[check] in message, f"{check}: {message}"
