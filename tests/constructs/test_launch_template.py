"""GpuLaunchTemplate for the types users get wrong most: interface counts and indices, placement
group, security group rules, IMDSv2, the DLAMI parameter, user data; cdk-nag and cfn-lint clean."""
from __future__ import annotations

import re
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import pytest
from aws_cdk.assertions import Match, Template

from constructs_lib import ConfigurationError, DeepLearningAmi, GpuLaunchTemplate
from constructs_lib.identity import NodeIdentity
from constructs_lib.node_options import NodeOptions
from tests.cdk_checks import cfn_lint, synth_with_nag
from tests.constructs.userdata_text import PSEUDO, evaluate, user_data_text

RUNTIME = Path(__file__).resolve().parents[2] / "constructs_lib" / "runtime"

CASES = {
    # type: (multi_node, EFA interfaces expected, DLAMI parameter fragment)
    "p4d.24xlarge": (True, 4, "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.11-ubuntu-24.04/"),
    "p5.48xlarge": (True, 32, "/aws/service/deeplearning/ami/x86_64/"),
    "p5en.48xlarge": (True, 16, "/aws/service/deeplearning/ami/x86_64/"),
    "g5.xlarge": (False, 0, "/aws/service/deeplearning/ami/x86_64/"),
    "p3.2xlarge": (False, 0, "/aws/service/deeplearning/ami/x86_64/"),
    "trn1.32xlarge": (True, 8, "/aws/service/neuron/dlami/multi-framework/ubuntu-24.04/latest/image_id"),
}


def _vpc(stack: cdk.Stack) -> ec2.Vpc:
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0, subnet_configuration=[
        ec2.SubnetConfiguration(name="nodes", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    vpc.add_flow_log("FlowLog")
    return vpc


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    """One app, one stack per case: synthesized once with cdk-nag, linted once with cfn-lint."""
    out = tmp_path_factory.mktemp("cdk.out")
    app = cdk.App(outdir=str(out))
    stacks = {}
    for name, (multi, _, _) in CASES.items():
        stack = cdk.Stack(app, name.replace(".", "-"), env=cdk.Environment(region="us-east-1"))
        GpuLaunchTemplate(stack, "Node", vpc=_vpc(stack), instance_type=name, multi_node=multi)
        stacks[name] = stack
    assembly = synth_with_nag(app)
    cfn_lint([Path(out) / f"{s.stack_name}.template.json" for s in stacks.values()])
    return {name: (Template.from_json(assembly.get_stack_by_name(s.stack_name).template),
                   bundle_object(Path(out), s.stack_name)) for name, s in stacks.items()}


@pytest.fixture(scope="module")
def synthesized(synth):
    return {name: t for name, (t, _) in synth.items()}


def bundle_object(out: Path, stack_name: str) -> tuple[str, str]:
    """(bucket, key) of the stack's one zip asset, as CDK's asset manifest says it is published."""
    import json
    manifest = json.loads((out / f"{stack_name}.assets.json").read_text())
    (asset,) = [a for a in manifest["files"].values() if a["source"]["packaging"] == "zip"]
    (dest,) = asset["destinations"].values()
    return evaluate({"Fn::Sub": dest["bucketName"]}), dest["objectKey"]


def _lt(template: Template) -> dict:
    (lt,) = template.find_resources("AWS::EC2::LaunchTemplate").values()
    return lt["Properties"]["LaunchTemplateData"]


@pytest.mark.parametrize("name", CASES)
def test_interfaces_match_the_catalog(synthesized, name):
    multi, efa_count, _ = CASES[name]
    data = _lt(synthesized[name])
    nics = data.get("NetworkInterfaces", [])
    if not efa_count:
        assert "NetworkInterfaces" not in data and data["SecurityGroupIds"]
        return
    efa = [n for n in nics if n["InterfaceType"] == "efa-only"]
    assert len(efa) == efa_count
    assert nics[0] == {**nics[0], "NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "interface"}
    cards = sorted(n["NetworkCardIndex"] for n in efa)
    assert cards == list(range(efa_count)), "one EFA on every network card"
    assert all(n["DeviceIndex"] == (1 if n["NetworkCardIndex"] == 0 else 0) for n in efa)
    assert all("AssociatePublicIpAddress" not in n for n in nics)
    assert "SecurityGroupIds" not in data, "groups live on the interfaces"


@pytest.mark.parametrize("name", CASES)
def test_placement_group_only_for_multi_node(synthesized, name):
    multi = CASES[name][0]
    t = synthesized[name]
    t.resource_count_is("AWS::EC2::PlacementGroup", 1 if multi else 0)
    if multi:
        t.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
        assert "GroupName" in _lt(t)["Placement"]


@pytest.mark.parametrize("name", CASES)
def test_security_group_rules(synthesized, name):
    t = synthesized[name]
    multi = CASES[name][0]
    sgs = t.find_resources("AWS::EC2::SecurityGroup")
    node_sg = [r for r in sgs.values() if "node" in r["Properties"]["GroupDescription"].lower()
               or "EFA" in r["Properties"]["GroupDescription"]]
    assert len(node_sg) == 1
    props = node_sg[0]["Properties"]
    assert "SecurityGroupIngress" not in props, "nothing open to the world (no SSH)"
    assert props["SecurityGroupEgress"] == [Match.object_like({"CidrIp": "0.0.0.0/0", "FromPort": 443})] or \
        any(e["FromPort"] == 443 for e in props["SecurityGroupEgress"])
    if multi:
        t.has_resource_properties("AWS::EC2::SecurityGroupIngress", {"IpProtocol": "-1", "SourceSecurityGroupId": Match.any_value()})
        t.has_resource_properties("AWS::EC2::SecurityGroupEgress", {"IpProtocol": "-1", "DestinationSecurityGroupId": Match.any_value()})


@pytest.mark.parametrize("name", CASES)
def test_imdsv2_encrypted_root_ssm_no_ssh(synthesized, name):
    t = synthesized[name]
    data = _lt(t)
    assert data["MetadataOptions"] == {"HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2,
                                       "HttpTokens": "required", "InstanceMetadataTags": "enabled"}
    (bdm,) = data["BlockDeviceMappings"]
    assert bdm["Ebs"] == {"DeleteOnTermination": True, "Encrypted": True, "VolumeSize": 200, "VolumeType": "gp3"}
    assert "KeyName" not in data
    # Session Manager instead of SSH, through its own named actions: no managed policy that would
    # also allow reading every SSM parameter (test_least_privilege.py checks the list).
    t.has_resource_properties("AWS::IAM::Role", {"Policies": Match.array_with([
        Match.object_like({"PolicyName": "SessionManager"})])})
    for role in t.find_resources("AWS::IAM::Role").values():
        assert "AmazonSSMManagedInstanceCore" not in str(role["Properties"].get("ManagedPolicyArns", ""))


@pytest.mark.parametrize("name", CASES)
def test_ami_from_public_ssm_parameter(synthesized, name):
    fragment = CASES[name][2]
    params = synthesized[name].to_json()["Parameters"]
    ami = [p for p in params.values() if p["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"]
    assert len(ami) == 1 and fragment in ami[0]["Default"]


@pytest.mark.parametrize("name", CASES)
def test_user_data_is_a_small_bootstrap_with_the_node_settings(synthesized, name):
    ud = user_data_text(_lt(synthesized[name]))
    assert ud.startswith("#!/bin/bash\n")
    assert not re.search(r"^\s*set -[a-z]*e", ud, flags=re.M), "no step may abort the bootstrap"
    procs = {"trn1.32xlarge": 32, "p4d.24xlarge": 8, "p5.48xlarge": 8, "p5en.48xlarge": 8}.get(name, 1)
    assert f'DL_PROCS_PER_NODE="{procs}"' in ud and f'DL_INSTANCE_TYPE="{name}"' in ud
    units = "dl-nvme-raid0.service dl-efa-env.service" if CASES[name][0] else "dl-nvme-raid0.service"
    assert f'DL_UNITS="{units}"' in ud
    assert 'MOUNT_POINT="/scratch"' in ud
    if name == "trn1.32xlarge":
        assert 'SDK="neuron"' in ud
    assert len(ud.encode()) < 8 * 1024, "about 7.1 KB: settings and bootstrap, no runtime"
    r = __import__("subprocess").run(["bash", "-n"], input=ud, text=True, capture_output=True)
    assert r.returncode == 0, f"user data is valid bash: {r.stderr}"


@pytest.mark.parametrize("name", CASES)
def test_user_data_holds_no_python_and_references_the_bundle(synth, name):
    t, (bucket, key) = synth[name]
    ud = user_data_text(_lt(t))
    assert f'DL_BUNDLE_URL="s3://{bucket}/{key}"' in ud
    runtime_lines = {line.strip() for p in RUNTIME.glob("*.py") for line in p.read_text().splitlines()
                     if len(line.strip()) > 24}
    assert not [line for line in ud.splitlines() if line.strip() in runtime_lines]
    assert "from __future__" not in ud and "\nimport " not in ud


@pytest.mark.parametrize("name", CASES)
def test_role_may_get_the_bundle_object_and_nothing_else_in_its_bucket(synth, name):
    t, (bucket, key) = synth[name]
    statements = [s for p in t.find_resources("AWS::IAM::Policy").values()
                  for s in p["Properties"]["PolicyDocument"]["Statement"]]
    s3 = [s for s in statements if "s3:" in json_dumps(s["Action"])]
    assert s3 == [{"Action": "s3:GetObject", "Effect": "Allow", "Resource": s3[0]["Resource"]}]
    assert evaluate(s3[0]["Resource"]) == f"arn:aws:s3:::{bucket}/{key}"


@pytest.mark.parametrize("name", CASES)
def test_a_node_that_shuts_itself_down_is_terminated(synthesized, name):
    assert _lt(synthesized[name])["InstanceInitiatedShutdownBehavior"] == "terminate"


def json_dumps(v) -> str:
    import json
    return json.dumps(v)


def test_p5_has_32_efa_and_one_ena(synthesized):
    nics = _lt(synthesized["p5.48xlarge"])["NetworkInterfaces"]
    assert len(nics) == 33 and sum(n["InterfaceType"] == "interface" for n in nics) == 1


# ---- validation: one clear message with a remediation, nothing synthesized -------------------

def _stack():
    app = cdk.App()
    stack = cdk.Stack(app, "V", env=cdk.Environment(region="us-east-1"))
    return stack, _vpc(stack)


@pytest.mark.parametrize("kwargs,expected", [
    ({"instance_type": "g5.xlarge", "efa": True}, "EfaSupported: EFA requested on g5.xlarge, which has no EFA"),
    ({"instance_type": "g6.xlarge", "multi_node": True}, "MultiNodeNeedsEfa"),
    ({"instance_type": "g5.xlarge", "machine_image": DeepLearningAmi(instance="g5g.xlarge")},
     "AmiArchitecture: an arm64 AMI cannot boot g5.xlarge"),
    ({"instance_type": "g5g.xlarge", "machine_image": ec2.MachineImage.latest_amazon_linux2023(),
      "ami_architecture": "x86_64"}, "an x86_64 AMI cannot boot g5g.xlarge"),
    ({"instance_type": "p4d.24xlarge", "efa": True, "associate_public_ip": True},
     "PublicIpWithSeveralInterfaces: a public IP cannot be requested at launch with 5 network interfaces"),
    ({"instance_type": "p4d.24xlarg"}, "unknown instance type 'p4d.24xlarg'; closest: p4d.24xlarge"),
])
def test_wrong_combinations_are_refused(kwargs, expected):
    stack, vpc = _stack()
    with pytest.raises(Exception) as e:
        GpuLaunchTemplate(stack, "Node", vpc=vpc, **kwargs)
    assert expected in str(e.value)
    assert "Fix:" in str(e.value) or "closest" in str(e.value)


def test_placement_group_spanning_azs_is_refused():
    app = cdk.App()
    stack = cdk.Stack(app, "V", env=cdk.Environment(account="111111111111", region="us-east-1"))
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-12345678", availability_zones=["us-east-1a", "us-east-1b"],
                                      private_subnet_ids=["subnet-aaaa1111", "subnet-bbbb2222"])
    with pytest.raises(ConfigurationError, match="PlacementGroupOneAz: the cluster placement group would span 2 AZs"):
        GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="p4d.24xlarge", multi_node=True,
                          subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS))


def test_a_placement_group_on_a_multi_az_vpc_without_subnets_is_refused_and_one_az_is_fine():
    """The README's example with max_azs=2 synthesized a placement group its nodes could not all
    join (issue 26): without `subnets`, the VPC's private subnets are what is checked."""
    app = cdk.App()
    stack = cdk.Stack(app, "V", env=cdk.Environment(account="111111111111", region="us-east-1"))
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-12345678", availability_zones=["us-east-1a", "us-east-1b"],
                                      private_subnet_ids=["subnet-aaaa1111", "subnet-bbbb2222"])
    with pytest.raises(ConfigurationError, match="would span 2 AZs.*availability_zones="):
        GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type=ec2.InstanceType("p4d.24xlarge"), multi_node=True)
    one = GpuLaunchTemplate(stack, "Node1", vpc=vpc, instance_type=ec2.InstanceType("p4d.24xlarge"), multi_node=True,
                            subnets=ec2.SubnetSelection(availability_zones=["us-east-1a"]))
    assert one.facts.instance_type == "p4d.24xlarge" and one.placement_group_name is not None
    # One node needs no placement group, so any VPC will do.
    GpuLaunchTemplate(stack, "Single", vpc=vpc, instance_type="p4d.24xlarge")


def test_raid_on_a_type_without_instance_store_is_a_note_not_a_warning():
    """How the type is, not a mistake (issue 28): a note the summary says once, no annotation."""
    stack, vpc = _stack()
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g6.xlarge")
    assert [f.rule for f in node.findings] == []  # g6 has NVMe
    node = GpuLaunchTemplate(stack, "Node2", vpc=vpc, instance_type="g5g.xlarge")
    assert [(f.rule, f.level) for f in node.findings] == [("RaidNeedsInstanceStore", "note")]
    from aws_cdk.assertions import Annotations
    Annotations.from_stack(stack).has_no_warning("/V/Node2", Match.any_value())


def test_user_data_limit_names_what_is_large():
    stack, vpc = _stack()
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g5.xlarge")
    node.add_user_data("echo " + "x" * 12000, "echo " + "y" * 5000)
    with pytest.raises(RuntimeError) as e:
        cdk.App.of(stack).synth()
    message = str(e.value)
    assert "over EC2's 16384-byte limit" in message
    assert "Largest first: extra user data (extra_user_data, add_user_data) 17012 bytes, bootstrap.sh" in message


def test_user_data_limit_counts_each_token_at_its_bound():
    stack, vpc = _stack()
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g5.xlarge")
    text = node.user_data_bytes() - 256  # the bundle's URL is one token
    filler = 16 * 1024 - text - 10 * 256 - 8
    node.add_user_data("# " + "z" * filler)  # the literal text still fits: only the tokens push it over
    for _ in range(10):
        node.add_user_data(f"echo {cdk.Aws.ACCOUNT_ID}")
    with pytest.raises(RuntimeError, match=r"and 11 token\(s\) counted at 256 bytes each\), over EC2's 16384-byte limit"):
        cdk.App.of(stack).synth()


def test_tokens_in_added_user_data_resolve_at_deploy_time():
    stack, vpc = _stack()
    bucket = __import__("aws_cdk.aws_s3", fromlist=["Bucket"]).Bucket(stack, "Data")
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g5.xlarge")
    node.add_user_data(f"aws s3 sync s3://{bucket.bucket_name}/data /scratch/data  # in {cdk.Aws.ACCOUNT_ID}")
    cdk.App.of(stack).synth()  # the size check passes with tokens in it
    t = Template.from_stack(stack)
    (logical,) = t.find_resources("AWS::S3::Bucket")
    ud = user_data_text(_lt(t), {logical: "my-data-bucket"})
    assert ud.endswith(f"aws s3 sync s3://my-data-bucket/data /scratch/data  # in {PSEUDO['AWS::AccountId']}\n")


def test_shared_pieces_are_passed_explicitly():
    stack, vpc = _stack()
    first = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="p5.48xlarge", multi_node=True)
    second = GpuLaunchTemplate(stack, "Alt", vpc=vpc, instance_type="p4d.24xlarge", multi_node=True,
                               role=first.role, instance_profile=first.instance_profile,
                               security_group=first.security_group, placement_group=first.placement_group)
    assert (second.role, second.security_group, second.placement_group) == (
        first.role, first.security_group, first.placement_group)
    t = Template.from_stack(stack)
    for kind in ("AWS::IAM::InstanceProfile", "AWS::EC2::SecurityGroup", "AWS::EC2::PlacementGroup"):
        t.resource_count_is(kind, 1)
    (role,) = t.find_resources("AWS::IAM::Role", {"Properties": {"AssumeRolePolicyDocument": {"Statement": [
        Match.object_like({"Principal": {"Service": "ec2.amazonaws.com"}})]}}})
    (sg,) = t.find_resources("AWS::EC2::SecurityGroup")
    (pg,) = t.find_resources("AWS::EC2::PlacementGroup")
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["Placement"]["GroupName"] == {"Ref": pg}
        assert all(n["Groups"] == [{"Fn::GetAtt": [sg, "GroupId"]}] for n in data["NetworkInterfaces"])
    (policy,) = t.find_resources("AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": role}]}}).values()
    assert len(policy["Properties"]["PolicyDocument"]["Statement"]) == 1, "the bundle grant, once"


def test_profile_instead_of_instance_type():
    stack, vpc = _stack()
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, profile="dev-prototyping")
    assert node.facts.instance_type == "g4dn.xlarge"


def test_escape_hatch_and_extra_user_data():
    stack, vpc = _stack()
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g5.xlarge", extra_user_data=["echo hello"])
    node.launch_template.node.default_child.add_property_override("LaunchTemplateData.Monitoring", {"Enabled": True})
    data = _lt(Template.from_stack(stack))
    assert data["Monitoring"] == {"Enabled": True}
    assert user_data_text(data).endswith("echo hello\n")


def test_job_command_with_the_heredoc_marker_is_refused():
    stack, vpc = _stack()
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g5.xlarge")
    with pytest.raises(ConfigurationError, match="the job command contains DL_LAUNCHER_EOF, the marker that ends it"):
        node.enable_job(cluster="c", command="cat <<DL_LAUNCHER_EOF\nx\nDL_LAUNCHER_EOF")


# ---- composition: identity, cluster network, bootstrap and options as separate pieces --------

def test_templates_sharing_one_identity_make_one_role_profile_and_group(tmp_path):
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Shared", env=cdk.Environment(region="us-east-1"))
    vpc = _vpc(stack)
    identity = NodeIdentity(stack, "Identity", vpc=vpc, efa=True, label="p5 cluster")
    first = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="p5.48xlarge", multi_node=True, identity=identity)
    second = GpuLaunchTemplate(stack, "Alt", vpc=vpc, instance_type="p4d.24xlarge", multi_node=True, identity=identity,
                               placement_group=first.placement_group)
    assert (first.role, first.instance_profile, first.security_group) == (
        second.role, second.instance_profile, second.security_group) == (
        identity.role, identity.instance_profile, identity.security_group)
    for t in (first, second):
        t.enable_job(cluster="c")
    assembly = synth_with_nag(app)  # the identity's acknowledgments hold outside a template too
    cfn_lint([tmp_path / "Shared.template.json"])
    t = Template.from_json(assembly.get_stack_by_name("Shared").template)
    for kind in ("AWS::IAM::InstanceProfile", "AWS::EC2::SecurityGroup", "AWS::EC2::PlacementGroup"):
        t.resource_count_is(kind, 1)
    (role,) = t.find_resources("AWS::IAM::Role", {"Properties": {"AssumeRolePolicyDocument": {"Statement": [
        Match.object_like({"Principal": {"Service": "ec2.amazonaws.com"}})]}}})
    (profile,) = t.find_resources("AWS::IAM::InstanceProfile")
    (sg,) = t.find_resources("AWS::EC2::SecurityGroup")
    templates = t.find_resources("AWS::EC2::LaunchTemplate").values()
    assert len(templates) == 2
    for lt in templates:
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": [profile, "Arn"]}}
        assert all(n["Groups"] == [{"Fn::GetAtt": [sg, "GroupId"]}] for n in data["NetworkInterfaces"])
    (policy,) = t.find_resources("AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": role}]}}).values()
    actions = sorted(s["Action"] for s in policy["Properties"]["PolicyDocument"]["Statement"])
    assert actions == ["ec2:DescribeInstances", "s3:GetObject"], "each grant once, however many templates"


def test_efa_group_allows_all_traffic_to_and_from_itself_and_https_out():
    stack, vpc = _stack()
    NodeIdentity(stack, "Identity", vpc=vpc, efa=True)
    t = Template.from_stack(stack)
    (sg, props), = t.find_resources("AWS::EC2::SecurityGroup").items()
    itself = {"Fn::GetAtt": [sg, "GroupId"]}
    (ingress,) = t.find_resources("AWS::EC2::SecurityGroupIngress").values()
    assert ingress["Properties"] == {**ingress["Properties"], "IpProtocol": "-1", "GroupId": itself,
                                     "SourceSecurityGroupId": itself}
    (egress,) = t.find_resources("AWS::EC2::SecurityGroupEgress").values()
    assert egress["Properties"] == {**egress["Properties"], "IpProtocol": "-1", "GroupId": itself,
                                    "DestinationSecurityGroupId": itself}
    assert "SecurityGroupIngress" not in props["Properties"], "nothing else may reach the nodes"
    assert [(e["CidrIp"], e["IpProtocol"], e["FromPort"], e["ToPort"])
            for e in props["Properties"]["SecurityGroupEgress"]] == [("0.0.0.0/0", "tcp", 443, 443)]


def test_a_group_without_efa_allows_https_out_only():
    stack, vpc = _stack()
    NodeIdentity(stack, "Identity", vpc=vpc)
    t = Template.from_stack(stack)
    (props,) = [r["Properties"] for r in t.find_resources("AWS::EC2::SecurityGroup").values()]
    assert [(e["CidrIp"], e["IpProtocol"], e["FromPort"], e["ToPort"]) for e in props["SecurityGroupEgress"]] == [
        ("0.0.0.0/0", "tcp", 443, 443)]
    assert "SecurityGroupIngress" not in props
    t.resource_count_is("AWS::EC2::SecurityGroupIngress", 0)


def test_node_options_give_the_root_volume():
    stack, vpc = _stack()
    GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g5.xlarge", options=NodeOptions(root_volume_gib=500))
    (bdm,) = _lt(Template.from_stack(stack))["BlockDeviceMappings"]
    assert bdm["Ebs"] == {"DeleteOnTermination": True, "Encrypted": True, "VolumeSize": 500, "VolumeType": "gp3"}


def test_a_keyword_prop_replaces_that_field_of_the_options():
    stack, vpc = _stack()
    options = NodeOptions(root_volume_gib=500, scratch_mount="/data", extra_user_data=["echo shared"])
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g5.xlarge", options=options, root_volume_gib=300)
    assert node.options == NodeOptions(root_volume_gib=300, scratch_mount="/data", extra_user_data=("echo shared",))
    data = _lt(Template.from_stack(stack))
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 300
    ud = user_data_text(data)
    assert 'MOUNT_POINT="/data"' in ud and ud.endswith("echo shared\n")


@pytest.mark.parametrize("kwargs,expected", [
    ({"root_volume_gib": 0}, "root_volume_gib must be 1 to 16384 (gp3), got 0"),
    ({"extra_user_data": "echo one string"}, "extra_user_data is a sequence of bash lines"),
])
def test_wrong_node_options_are_refused(kwargs, expected):
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        NodeOptions(**kwargs)


def test_identity_and_its_pieces_are_not_both_given():
    stack, vpc = _stack()
    identity = NodeIdentity(stack, "Identity", vpc=vpc)
    with pytest.raises(ConfigurationError, match="give identity, or role, instance_profile and security_group"):
        GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="g5.xlarge", identity=identity, role=identity.role)


def test_efa_nodes_refuse_an_identity_whose_group_blocks_efa():
    stack, vpc = _stack()
    identity = NodeIdentity(stack, "Identity", vpc=vpc)
    with pytest.raises(ConfigurationError, match=r"make it with NodeIdentity\(efa=True\)"):
        GpuLaunchTemplate(stack, "Node", vpc=vpc, instance_type="p5.48xlarge", multi_node=True, identity=identity)


# Logical ids synthesized by GpuLaunchTemplate before it was split into NodeIdentity,
# EfaNetworking and NodeBootstrap: an update from that version must replace nothing, least of
# all the security and placement groups that running nodes are in.
BEFORE_THE_SPLIT = {
    "g5.xlarge": {"NodeProfile0CC57965", "NodeRoleD4034043", "NodeRoleDefaultPolicyD881D3CD", "NodeSgBA7C7D7A",
                  "NodeTemplateB678860E"},
    "p5.48xlarge": {"NodeEfaClusterE86F8516", "NodeEfaSgB6A2D1B5", "NodeProfile0CC57965", "NodeRoleD4034043",
                    "NodeRoleDefaultPolicyD881D3CD", "NodeTemplateB678860E"},
}


@pytest.mark.parametrize("name", BEFORE_THE_SPLIT)
def test_logical_ids_are_those_from_before_the_split(synthesized, name):
    ids = {k for k, r in synthesized[name].to_json()["Resources"].items()
           if k.startswith("Node") and r["Type"] in ("AWS::IAM::Role", "AWS::IAM::Policy", "AWS::IAM::InstanceProfile",
                            "AWS::EC2::SecurityGroup", "AWS::EC2::PlacementGroup", "AWS::EC2::LaunchTemplate")}
    assert ids == BEFORE_THE_SPLIT[name]


def test_a_profile_is_ranked_for_the_stacks_own_region():
    # multi-node-training picks p6-b200 in us-east-1 but p4d in eu-west-1 (no p6 offered there in
    # the catalog): a template in eu-west-1 must not launch a type chosen for us-east-1.
    app = cdk.App()
    stack = cdk.Stack(app, "Eu", env=cdk.Environment(region="eu-west-1"))
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1)
    node = GpuLaunchTemplate(stack, "Node", vpc=vpc, profile="multi-node-training", multi_node=True)
    assert node.facts.instance_type == "p4d.24xlarge"
    assert "eu-west-1" in node.facts.regions
    (lt,) = Template.from_stack(stack).find_resources("AWS::EC2::LaunchTemplate").values()
    assert lt["Properties"]["LaunchTemplateData"]["InstanceType"] == "p4d.24xlarge"
