"""The CDK app: every profile synthesizes (one process, cdk-nag and cfn-lint clean), the real CLI
synthesizes with no credentials and no network, and bad context is one line with no stack."""
from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from dl_selector.profiles import builtin_profiles
from dl_stacks.selection import money, select
from dl_stacks.settings import from_context
from dl_stacks.training_stack import TrainingStack, summary
from tests.cdk_checks import CHECKOV_SKIPS, cdk_cli as cli, cfn_lint, checkov, synth_with_nag

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted(builtin_profiles())


@pytest.fixture(scope="session")
def all_profiles(tmp_path_factory):
    """One app with a stack per profile, synthesized once with cdk-nag, linted once."""
    out = tmp_path_factory.mktemp("cdk.out")
    app = cdk.App(outdir=str(out))
    stacks = {p: TrainingStack.for_settings(app, from_context({"profile": p, "job": p}), quiet=True) for p in PROFILES}
    assembly = synth_with_nag(app)
    templates = [out / f"{s.stack_name}.template.json" for s in stacks.values()]
    cfn_lint(templates)
    found = checkov(templates)
    import tomllib
    stale = set(tomllib.loads(CHECKOV_SKIPS.read_text())) - set(found)
    assert not stale, f"{CHECKOV_SKIPS.name} explains checks that no longer fire: {sorted(stale)}"
    return _Profiles({p: (s, Template.from_json(assembly.get_stack_by_name(s.stack_name).template))
                      for p, s in stacks.items()}, assembly)


class _Profiles(dict):
    """{profile: (stack, Template)}, with the cloud assembly they came from."""

    def __init__(self, items: dict, assembly) -> None:
        super().__init__(items)
        self.assembly = assembly


@pytest.mark.parametrize("profile", PROFILES)
def _spec(t: Template) -> dict:
    """The controller's cluster spec, with CloudFormation's tokens left as they are."""
    (fn,) = t.find_resources("AWS::Lambda::Function", {"Properties": {
        "Handler": "constructs_lib.fleet.handler.handle"}}).values()
    value = fn["Properties"]["Environment"]["Variables"]["DL_CLUSTER_SPEC"]
    text = "".join(p if isinstance(p, str) else "TOKEN" for p in value["Fn::Join"][1]) if isinstance(value, dict) else value
    return json.loads(text)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_synthesizes_with_its_pick(all_profiles, profile):
    stack, t = all_profiles[profile]
    outputs = t.to_json()["Outputs"]
    assert outputs["InstanceType"]["Value"] == stack.selection.pick.instance_type
    for key in ("Alternates", "ClusterCostPerHour", "CheckpointBucket", "SsmSessionCommand", "CapacityStatusCommand"):
        assert key in outputs
    (bucket,) = t.find_resources("AWS::S3::Bucket", {"Properties": {"VersioningConfiguration": {"Status": "Enabled"}}}).values()
    assert bucket["DeletionPolicy"] == "Retain"


@pytest.mark.parametrize("profile", PROFILES)
def test_no_capacity_resource_can_mix_accelerators_and_no_option_exceeds_the_ceiling(all_profiles, profile):
    """Checked against the catalog's facts, not the selector's rule: in a cluster of several nodes
    every option has the pick's accelerator, memory and count; no option costs more than the ceiling."""
    from dl_selector.catalog import load_catalog

    stack, t = all_profiles[profile]
    for mixing in ("AWS::AutoScaling::AutoScalingGroup", "AWS::EC2::EC2Fleet", "AWS::EC2::SpotFleet"):
        t.resource_count_is(mixing, 0)
    spec = _spec(t)
    catalog = load_catalog()
    facts = [catalog.get(o["instance_type"]) for o in spec["options"]]
    assert facts[0].instance_type == stack.selection.pick.instance_type
    if spec["nodes"] > 1:
        assert len({(f.accelerator, f.accelerator_memory_gib, f.accelerator_count) for f in facts}) == 1
    assert all(o["price"] is not None and o["price"] <= spec["max_price"] for o in spec["options"])
    worst = max(o["price"] for o in spec["options"]) * spec["nodes"]
    assert worst <= spec["max_price"] * spec["nodes"] + 1e-9
    assert spec["max_price"] == stack.selection.ceiling


def test_multi_node_training_is_two_efa_nodes_in_one_placement_group_on_spot(all_profiles):
    stack, t = all_profiles["multi-node-training"]
    spec = _spec(t)
    assert (spec["nodes"], spec["market"], len(spec["subnet_ids"])) == (2, "spot", 1)
    t.resource_count_is("AWS::EC2::PlacementGroup", 1)
    pick = stack.selection.facts
    lts = t.find_resources("AWS::EC2::LaunchTemplate")
    first = next(lt for lt in lts.values() if lt["Properties"]["LaunchTemplateData"]["InstanceType"] == pick.instance_type)
    assert "GroupName" in first["Properties"]["LaunchTemplateData"]["Placement"]
    nics = first["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    assert sum(n["InterfaceType"] == "efa-only" for n in nics) == pick.max_efa_interfaces
    from tests.constructs.userdata_text import user_data_text
    ud = user_data_text(first["Properties"]["LaunchTemplateData"])
    assert "dl-job.service" in ud and 'DL_CLUSTER="dl-multi-node-training"' in ud
    tags = {tg["Key"]: tg["Value"] for spec in first["Properties"]["LaunchTemplateData"]["TagSpecifications"]
            for tg in spec["Tags"]}
    assert tags["dl-launcher:cluster"] == "dl-multi-node-training" and tags["dl-launcher:nodes"] == "2"


def test_vpc_is_one_az_private_with_s3_endpoint_and_flow_logs(all_profiles):
    _, t = all_profiles["multi-node-training"]
    t.resource_count_is("AWS::EC2::NatGateway", 1)
    t.has_resource_properties("AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Gateway"})
    t.resource_count_is("AWS::EC2::FlowLog", 1)
    subnets = t.find_resources("AWS::EC2::Subnet")
    assert len({json.dumps(s["Properties"]["AvailabilityZone"]) for s in subnets.values()}) == 1


def test_real_cli_synth_with_only_aws_region_targets_and_prices_that_region(tmp_path):
    """The pinned CLI synthesizes with no credentials, no AWS configuration and no network (cdk_cli
    strips them), and issue 24: AWS_REGION=eu-central-1 used to deploy to us-east-1, and
    eu-central-1 had no prices."""
    r = cli("synth", "-c", "profile=multi-node-training", "-c", "approve_hourly=1000", "--quiet", "-o", str(tmp_path),
            env_extra={"AWS_REGION": "eu-central-1"})
    assert r.returncode == 0, r.stderr[-3000:]
    first = r.stderr[r.stderr.index("dl-launcher: profile"):].splitlines()[0]
    assert first.startswith("dl-launcher: profile multi-node-training in eu-central-1 (CDK_DEFAULT_REGION): 2 x "), first
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["artifacts"]["dl-multi-node-training"]["environment"].endswith("/eu-central-1")
    template = json.loads((tmp_path / "dl-multi-node-training.template.json").read_text())
    cost = template["Outputs"]["ClusterCostPerHour"]["Value"]
    assert "unknown" not in cost and "$" in cost, cost
    assert "ceiling $" in r.stderr and "eu-central-1, EC2's default spot max price" in r.stderr
    assert "why:" in r.stderr


@pytest.mark.parametrize("args,expected", [
    (["-c", "profile=multinode"], "error: unknown profile 'multinode'"),
    (["-c", "profile=training", "-c", "nodes=zero"], "error: context nodes='zero'"),
    (["-c", "profil=inference"], "error: unknown context key 'profil'; closest: profile"),
    (["-c", "market=spt"], "error: context market='spt': allowed spot, on-demand, capacity-block; closest: spot"),
    (["-c", "interchange=any"], "error: context interchange='any': allowed same-accelerator, same-count"),
    (["-c", "profile=multi-node-training", "-c", "capacity_reservation=cr-0123456789abcdef0"],
     "error: context capacity_reservation=cr-0123456789abcdef0 with spot"),
    (["-c", "profile=multi-node-training", "-c", "region=ap-south-2", "-c", "market=on-demand"],
     "error: p6-b300.48xlarge has no on-demand price on record in ap-south-2: pass -c max_price=USD/h"),
])
def test_bad_context_is_one_line_and_no_stack(tmp_path, capsys, args, expected):
    """In-process through app.main, the entry `cdk synth` runs: that the real CDK CLI prints the very
    line app.main does (exit status non-zero, no template) is test_bad_context.py's
    test_bad_context_through_the_cdk_cli."""
    import app
    context = dict(a.split("=", 1) for a in args if a != "-c")
    code = app.main(context, outdir=str(tmp_path))
    err = capsys.readouterr().err
    assert code != 0
    assert expected in err and "Traceback" not in err, err[-2000:]
    assert not list(tmp_path.glob("*.template.json"))


# ---- what it costs: the summary and the outputs ---------------------------------------------------
def _worst_line(text: str) -> str:
    (line,) = [x for x in text.splitlines() if x.startswith("  worst case, whole cluster: ")]
    return line


@pytest.mark.parametrize("profile", PROFILES)
def test_summary_worst_case_holds_the_ceiling(profile):
    s = from_context({"profile": profile})
    sel = select(s)
    w, ceiling, alone = sel.worst_case(s.nodes), sel.ceiling, sel.pick_cost(s.nodes)
    line = _worst_line(summary(s, sel))
    assert line.startswith(f"  worst case, whole cluster: {money(w.market)} {s.market} ")
    assert f"<= {s.nodes} x ceiling = {money(s.nodes * ceiling)}" in line
    assert w.market <= s.nodes * ceiling + 1e-9
    if s.market == "spot":
        # EC2 may charge up to the max price it was sent, the pick's on-demand price by default
        assert w.market == pytest.approx(s.nodes * ceiling) and alone <= w.market + 1e-9
        assert "expected on spot: " in summary(s, sel)
    else:
        assert w.market == pytest.approx(alone), "by default the worst case is the pick's own cluster price"


def test_summary_shows_ceiling_options_and_rejected_reasons():
    s = from_context({"profile": "multi-node-training", "instance_type": "p4d.24xlarge", "interchange": "same-count"})
    text = summary(s, select(s))
    assert ("market: spot; ceiling $21.96/h per node, spot (p4d.24xlarge's on-demand price in us-east-1, EC2's "
            "default spot max price: a stale or one-AZ quote cannot keep the cluster from launching)") in text
    assert "-c max_price=USD/h sets it" in text
    assert "  expected on spot: $8.00/h per node (median of " in text and "as of 2026-01, " in text
    assert " days old; github:skypilot-org/skypilot-catalog@" in text  # the spot figure's date and source (issue 39)
    assert "    p4d.24xlarge $8.00/h spot (on record; on-demand $21.96/h)" in text
    assert "all on-demand" in _worst_line(text) and "all spot" in _worst_line(text)
    assert "  not taken (" in text
    assert "p5en.48xlarge: price $17.40/h spot is above the pick's own spot price $8.00/h" in text
    capped = from_context({"profile": "multi-node-training", "max_price": "30"})
    assert "ceiling $30.00/h per node, spot (max_price, as you set it)" in summary(capped, select(capped))


def test_summary_truncates_the_rejected_list_with_a_count():
    s = from_context({"profile": "single-gpu-training"})
    sel = select(s)
    text = summary(s, sel)
    assert len(sel.rejected) > 3
    assert f"  not taken ({len(sel.rejected)}):" in text and f"... and {len(sel.rejected) - 3} more" in text


def test_summary_names_the_capacity_block():
    s = from_context({"profile": "multi-node-training", "region": "us-east-2", "instance_type": "p5e.48xlarge",
                      "market": "capacity-block", "capacity_reservation": "cr-0123456789abcdef0", "max_price": "40"})
    text = summary(s, select(s))
    assert "market: capacity-block into cr-0123456789abcdef0; ceiling $40.00/h per node" in text
    assert "$80.00/h capacity-block" in _worst_line(text)


@pytest.mark.parametrize("profile", ["multi-node-training", "single-gpu-training", "dev-prototyping"])
def test_cost_outputs_say_the_worst_case_and_the_alternates(all_profiles, profile):
    stack, t = all_profiles[profile]
    sel, n = stack.selection, stack.settings.nodes
    outputs = t.to_json()["Outputs"]
    assert outputs["Alternates"]["Value"] == (",".join(c.instance_type for c in sel.alternates) or "none")
    assert f"rule {sel.interchange}" in outputs["Alternates"]["Description"]
    if sel.rejected:
        assert f"{len(sel.rejected)} other candidates not taken" in outputs["Alternates"]["Description"]
    cost = outputs["ClusterCostPerHour"]["Value"]
    assert cost.startswith(f"{n} x {sel.pick.instance_type} or an alternate: at most "
                           f"{money(sel.worst_case(n).market)} {sel.market}")
    assert f"ceiling {money(sel.ceiling)}" in cost
    assert "ceiling:" in outputs["ClusterCostPerHour"]["Description"]


def test_the_deployer_policy_covers_every_resource_type_a_training_stack_declares(all_profiles, tmp_path):
    """docs/deployer-policy.json (cdk bootstrap --cloudformation-execution-policies) is generated
    from the launch role's table; every type in every profile's template, and in a stack with
    code, env, a secret, its key, an image and FSx for its data, must have its row and every row's actions."""
    import app
    from scripts.deployer_policy import OUT, policy, render
    from dl_stacks.job_settings import EXAMPLES
    from dl_stacks.launch_role import permissions_for

    assert OUT.read_text() == render(), "stale: python scripts/deployer_policy.py --write"
    ctx = {"profile": "multi-node-training", "job": "full", "command": "dl-torchrun train.py", "budget": "1000",
           "approve_hourly": "1000",
           **{k: EXAMPLES[k] for k in ("code", "image", "env", "secrets", "secrets_kms", "data", "data_mode")}}
    assert app.main(ctx, outdir=str(tmp_path)) == 0
    templates = [t.to_json() for _s, t in all_profiles.values()]
    templates.append(json.loads((tmp_path / "dl-full.template.json").read_text()))
    types = {r["Type"] for t in templates for r in t["Resources"].values()}
    granted = {a for s in policy()["Statement"] for a in s["Action"]}
    for actions in permissions_for(types).values():  # a type without a row raises here
        assert set(actions) <= granted
    assert len(json.dumps(policy(), separators=(",", ":"))) <= 6144, "IAM's managed-policy size limit"
    resources = {s["Resource"] for s in policy()["Statement"]}
    assert "arn:aws:iam::*:role/dl-*" in resources and not any("SC-" in r for r in resources)


def test_every_warning_of_every_profile_names_what_to_do(all_profiles):
    """Issue 28: noise teaches people to skip warnings. A fact of a chosen type (no NVMe) is a
    note in the summary; every warning left says what to do ("Fix: ...")."""
    # The warnings as the synthesized assembly recorded them (Annotations.from_stack would synthesize
    # the whole 16-stack app again for each stack: minutes for what one read of the manifest says).
    from aws_cdk import cx_api
    assembly = all_profiles.assembly
    for profile, (stack, _t) in all_profiles.items():
        messages = assembly.get_stack_by_name(stack.stack_name).messages
        warnings = [m for m in messages if m.level == cx_api.SynthesisMessageLevel.WARNING]
        for w in warnings:
            assert "Fix: " in str(w.entry.data), (profile, w.entry.data)
    s = from_context({"profile": "arm"})
    stack = TrainingStack(cdk.App(), "dl-arm-notes", settings=s, selection=select(s))
    assert any("g5g.xlarge has no instance-store NVMe: /scratch is on the root volume" in n for n in stack.notes())
    assert "  note: g5g.xlarge has no instance-store NVMe" in summary(s, select(s), notes=stack.notes())


def test_every_policy_of_every_profile_is_one_aws_documents(all_profiles):
    """Issue 35, item 1: each action, condition key and resource type in every policy of every
    profile's stack (node, controller, guard and Lambda roles, bucket and key policies) as AWS's
    service authorization reference lists them (tests/iam_reference.py)."""
    from tests.iam_reference import check_template, policy_count

    problems, policies = [], 0
    for profile, (_stack, t) in all_profiles.items():
        problems += check_template(t.to_json(), profile)
        policies += policy_count(t.to_json())
    assert policies >= 10 * len(all_profiles)
    assert not problems, "\n".join(problems)
