"""The README's example: another CDK app importing the constructs synthesizes and is lint-clean."""
from __future__ import annotations

import runpy
from pathlib import Path

import aws_cdk as cdk
from aws_cdk.assertions import Template

from tests.cdk_checks import cfn_lint

ROOT = Path(__file__).resolve().parents[2]


def test_example_app_synthesizes(tmp_path):
    module = runpy.run_path(str(ROOT / "examples" / "own_cdk_app.py"), run_name="example")
    app = cdk.App(outdir=str(tmp_path))
    stack = module["ResearchCluster"](app, "ResearchCluster", env=cdk.Environment(region="us-east-1"))
    t = Template.from_stack(stack)
    t.resource_count_is("AWS::EC2::PlacementGroup", 1)
    (lt,) = t.find_resources("AWS::EC2::LaunchTemplate").values()
    assert len(lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]) == 33
    app.synth()
    cfn_lint([tmp_path / "ResearchCluster.template.json"])
