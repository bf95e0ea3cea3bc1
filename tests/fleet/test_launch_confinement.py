"""Issue 22 (low): the controller's role launches only from its own stack's launch templates, into
its own subnets, with its own security group. Checked by evaluating the synthesized policies the
way IAM documents it (an explicit deny wins; a negated operator is true when the key is absent)
for CreateFleet and for the RunInstances authorization an EC2 Fleet instant launch makes, on each
resource type AWS's service authorization reference lists for that action and with only the
condition keys it lists there (issue 35: this test once put ec2:LaunchTemplate into CreateFleet's
context, where AWS never does, and so passed a policy that denied every launch)."""
from __future__ import annotations

import fnmatch
import json

import pytest

from constructs_lib.runtime import contract
from tests.cdk_checks import listify, role_statements, training_template
from tests.constructs.userdata_text import evaluate
from tests.iam_reference import documented

ACCOUNT = "123456789012"
STACK_ID = "<AWS::StackId>"  # what evaluate() leaves for the stack id: one value, compared as such


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return training_template(tmp_path_factory.mktemp("cdk.out"), "fenced")


@pytest.fixture(scope="module")
def controller(template):
    res = template["Resources"]
    (role,) = [k for k, r in res.items() if r["Type"] == "AWS::IAM::Role" and "ControllerRole" in k]
    statements = role_statements(template, role)
    # what the controller launches with: its spec's templates and subnets
    (fn,) = [r for r in res.values() if r["Type"] == "AWS::Lambda::Function"
             and r["Properties"]["Role"] == {"Fn::GetAtt": [role, "Arn"]}]
    spec = json.loads(evaluate(fn["Properties"]["Environment"]["Variables"]["DL_CLUSTER_SPEC"]))
    templates = [o["launch_template_id"] for o in spec["options"]]
    subnets = spec["subnet_ids"]
    groups = {k: r for k, r in res.items() if r["Type"] == "AWS::EC2::SecurityGroup"}
    return {"statements": [_resolve(st) for st in statements], "templates": templates,
            "subnets": subnets, "groups": groups}


def _resolve(st: dict) -> dict:
    def ev(v):
        if isinstance(v, dict) and len(v) == 1 and next(iter(v)).startswith(("Fn::", "Ref")):
            return evaluate(v)
        if isinstance(v, dict):
            return {k: ev(x) for k, x in v.items()}
        if isinstance(v, list):
            return [ev(x) for x in v]
        return v
    return ev(st)


def _holds(op: str, have, want) -> bool:
    want = [str(w) for w in listify(want)]
    if op in ("StringEquals", "ArnEquals"):
        return have is not None and str(have) in want
    if op == "ArnLike":
        return have is not None and any(fnmatch.fnmatchcase(str(have), w) for w in want)
    if op in ("StringNotEquals", "ArnNotEquals"):
        return have is None or str(have) not in want
    if op == "ForAnyValue:StringEquals":
        return have is not None and any(h in want for h in listify(have))
    raise AssertionError(f"the test's evaluator has no {op}")


def _applies(st: dict, action: str, arn: str, ctx: dict) -> bool:
    if not any(fnmatch.fnmatchcase(action, a) for a in listify(st["Action"])):
        return False
    if not any(fnmatch.fnmatchcase(arn, r) for r in listify(st["Resource"])):
        return False
    return all(_holds(op, ctx.get(key), want) for op, kv in st.get("Condition", {}).items() for key, want in kv.items())


def _launch(controller, *, template: str, subnet: str, group_tag, cluster="dl-fenced", stack=STACK_ID) -> list[str]:
    """What an instant fleet's RunInstances asks of IAM, one (resource, context) a resource; the
    reasons it is refused (an explicit deny, or a resource no allow covers), empty if allowed."""
    lt = f"arn:aws:ec2:us-east-1:{ACCOUNT}:launch-template/{template}"
    base = {"ec2:LaunchTemplate": lt, "aws:RequestedRegion": "us-east-1"}
    requests = [
        ("instance", f"arn:aws:ec2:us-east-1:{ACCOUNT}:instance/*", {
            **base, f"aws:RequestTag/{contract.TAG_CLUSTER}": cluster, f"aws:RequestTag/{contract.TAG_STACK}": stack}),
        ("network-interface", f"arn:aws:ec2:us-east-1:{ACCOUNT}:network-interface/*",
         {**base, "ec2:Subnet": f"arn:aws:ec2:us-east-1:{ACCOUNT}:subnet/{subnet}"}),
        ("security-group", f"arn:aws:ec2:us-east-1:{ACCOUNT}:security-group/sg-0123456789abcdef0",
         {**base, **({f"aws:ResourceTag/{contract.TAG_STACK}": group_tag} if group_tag else {})}),
        ("subnet", f"arn:aws:ec2:us-east-1:{ACCOUNT}:subnet/{subnet}", base),
        ("launch-template", lt, base),
        ("image", "arn:aws:ec2:us-east-1::image/ami-0123456789abcdef0", base),
        ("volume", f"arn:aws:ec2:us-east-1:{ACCOUNT}:volume/*", base),
        ("fleet", f"arn:aws:ec2:us-east-1:{ACCOUNT}:fleet/fleet-0123", base),
    ]
    why = []
    for action in ("ec2:CreateFleet", "ec2:RunInstances"):
        for kind, arn, everything in requests:
            # Only the resource types, and on each only the keys, AWS documents for the action.
            if not documented(action, kind):
                continue
            ctx = {k: v for k, v in everything.items() if k.startswith("aws:Requested") or documented(action, kind, k)}
            denied = [st for st in controller["statements"] if st["Effect"] == "Deny" and _applies(st, action, arn, ctx)]
            allowed = [st for st in controller["statements"] if st["Effect"] == "Allow" and _applies(st, action, arn, ctx)]
            if denied:
                why.append(f"{action} {arn}: denied")
            elif not allowed:
                why.append(f"{action} {arn}: no allow")
    return why


def test_its_own_launch_is_allowed(controller):
    assert len(controller["templates"]) >= 1 and controller["subnets"]
    for lt in controller["templates"]:
        assert _launch(controller, template=lt, subnet=controller["subnets"][0], group_tag=STACK_ID) == []


def test_another_launch_template_is_denied(controller):
    why = _launch(controller, template="lt-0someoneelses00000", subnet=controller["subnets"][0],
                  group_tag=STACK_ID)
    # CreateFleet is allowed on the stack's own templates only; the instances' RunInstances is denied
    assert "ec2:CreateFleet arn:aws:ec2:us-east-1:123456789012:launch-template/lt-0someoneelses00000: no allow" in why
    assert any(w.startswith("ec2:RunInstances") and "instance/*: denied" in w for w in why), why


def test_another_subnet_is_denied(controller):
    why = _launch(controller, template=controller["templates"][0], subnet="subnet-0public000000000",
                  group_tag=STACK_ID)
    assert any("network-interface" in w and "denied" in w for w in why), why
    assert any(w.startswith("ec2:CreateFleet") and "subnet/subnet-0public" in w for w in why), why


@pytest.mark.parametrize("tag", [None, "arn:aws:cloudformation:us-east-1:123456789012:stack/other/1"])
def test_a_security_group_not_of_this_stack_is_denied(controller, tag):
    why = _launch(controller, template=controller["templates"][0], subnet=controller["subnets"][0],
                  group_tag=tag)
    assert any("security-group" in w and "denied" in w for w in why), why


def test_the_nodes_security_group_carries_the_stack_tag_the_deny_reads(controller):
    tagged = [k for k, r in controller["groups"].items()
              if {"Key": contract.TAG_STACK, "Value": {"Ref": "AWS::StackId"}} in r["Properties"].get("Tags", [])]
    assert tagged, "the nodes' group lacks the stack tag: every launch would be denied"
