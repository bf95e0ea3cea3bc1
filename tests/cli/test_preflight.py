"""Preflight's checks, each on its ok and its fail path, against moto (STS, SSM, EC2's instance
type offerings, which moto carries as recorded from AWS) and, for Service Quotas, whose EC2
quotas moto does not model, GetServiceQuota answers in the API reference's response shape
through botocore's Stubber."""
from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from constructs_lib.ami import dlami_parameter
from dl_launcher import preflight
from dl_selector.catalog import load_catalog

FACTS = load_catalog().types["p5.48xlarge"]


def _plan(region="us-east-1", nodes=2, market="spot", az=None, facts=FACTS):
    return preflight.Plan(facts, nodes, market, region, "AWS_REGION", az)


def _quotas(region: str, code: str, value: float):
    client = boto3.client("service-quotas", region_name=region)
    stub = Stubber(client)
    stub.add_response("get_service_quota", {"Quota": {
        "ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaArn": f"arn:aws:servicequotas:{region}:123456789012:ec2/{code}", "QuotaCode": code,
        "QuotaName": preflight.QUOTAS[("P", "spot")][1] if code == "L-7212CCBC" else "quota", "Value": value,
        "Unit": "None", "Adjustable": True, "GlobalQuota": False}}, {"ServiceCode": "ec2", "QuotaCode": code})
    stub.activate()
    return client


def _clients(region: str, quota_value: float = 384.0, bootstrapped: bool = True, ami: bool = True):
    ssm = boto3.client("ssm", region_name=region)
    if bootstrapped:
        ssm.put_parameter(Name=preflight.BOOTSTRAP_PARAMETER, Value="27", Type="String")
    if ami:  # AWS's public /aws/service parameter: moto refuses PutParameter there, as AWS does
        import datetime as dt

        from moto.ssm.models import Parameter, ssm_backends

        name = dlami_parameter(sdk="cuda", architecture="x86_64")
        ssm_backends["123456789012"][region]._parameters[name].append(Parameter(
            account_id="123456789012", name=name, value="ami-0abcdef1234567890", parameter_type="String",
            description="", allowed_pattern=None, keyid=None, last_modified_date=dt.datetime.now(), version=1,
            data_type="aws:ec2:image"))
    made = {"sts": boto3.client("sts", region_name=region), "ssm": ssm, "ec2": boto3.client("ec2", region_name=region),
            "service-quotas": _quotas(region, "L-7212CCBC", quota_value)}
    return made.__getitem__


def _by_check(results):
    return {r.check: r for r in results}


def test_everything_in_place_is_ok_but_the_plugin_is_named(aws):
    got = _by_check(preflight.run(_plan(), _clients("us-east-1"), which=lambda _: None))
    assert [r.level for r in got.values()] == ["ok"] * 6 + ["warn"], got
    assert got["credentials"].found.startswith("account 123456789012 as arn:aws:sts::123456789012:")
    assert got["vCPU quota"].found == "'All P Spot Instance Requests' (L-7212CCBC) is 384 vCPUs; 2 x p5.48xlarge need 384"
    assert got["offered"].found.startswith("p5.48xlarge in us-east-1")
    assert "session-manager-plugin" in got["Session Manager plugin"].found


def test_a_quota_below_nodes_times_vcpus_fails_with_the_number_and_the_link(aws):
    got = _by_check(preflight.run(_plan(), _clients("us-east-1", quota_value=0.0), which=lambda _: "/x"))
    q = got["vCPU quota"]
    assert q.level == "fail" and "is 0 vCPUs; 2 x p5.48xlarge need 2 x 192 = 384" in q.found
    assert q.fix == ("request 384 at https://console.aws.amazon.com/servicequotas/home/services/ec2/quotas/L-7212CCBC "
                     "(increases take hours to days)")


def test_a_type_not_sold_in_the_region_fails(aws):
    # moto's offerings are AWS's, recorded: p5.48xlarge is not sold in eu-central-1 there
    got = _by_check(preflight.run(_plan(region="eu-central-1"), _clients("eu-central-1"), which=lambda _: "/x"))
    assert got["offered"].level == "fail" and "not sold in any AZ of eu-central-1" in got["offered"].found
    assert "us-east-1" in got["offered"].fix


def test_an_az_without_the_type_fails_with_one_that_has_it(aws):
    zones = [o["Location"] for o in boto3.client("ec2", region_name="us-east-1").describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": ["p5.48xlarge"]}])[
        "InstanceTypeOfferings"]]
    missing = next(z for z in (f"us-east-1{c}" for c in "abcdefghijklmnopqrstuvwxyz") if z not in zones)
    got = _by_check(preflight.run(_plan(az=missing), _clients("us-east-1"), which=lambda _: "/x"))
    assert got["offered"].level == "fail" and got["offered"].fix.startswith("-c availability_zone=us-east-1")


def test_no_bootstrap_and_no_ami_fail_with_the_command(aws):
    got = _by_check(preflight.run(_plan(), _clients("us-east-1", bootstrapped=False, ami=False), which=lambda _: "/x"))
    assert got["cdk bootstrap"].level == "fail" and got["cdk bootstrap"].fix == "cdk bootstrap aws://123456789012/us-east-1"
    assert got["Deep Learning AMI"].level == "fail"


def test_no_credentials_stops_after_saying_so(monkeypatch):
    from botocore.exceptions import NoCredentialsError

    class NoSts:
        def get_caller_identity(self):
            raise NoCredentialsError()

    got = preflight.run(_plan(), {"sts": NoSts()}.__getitem__, which=lambda _: "/x")
    assert [r.check for r in got] == ["credentials", "region", "Session Manager plugin"]
    assert got[0].level == "fail" and "aws configure sso" in got[0].fix


@pytest.mark.parametrize("instance_type,market,code", [
    ("p5.48xlarge", "on-demand", "L-417A185B"), ("g6e.xlarge", "spot", "L-3819A6DF"),
    ("trn1.32xlarge", "on-demand", "L-2C3B7624"), ("inf2.xlarge", "spot", "L-B5D1601B"),
    ("dl1.24xlarge", "on-demand", "L-6E869C2A"), ("p6-b200.48xlarge", "spot", "L-7212CCBC")])
def test_each_family_class_and_market_has_its_quota(instance_type, market, code):
    assert preflight.quota_for(instance_type, market)[0] == code


def test_synth_runs_the_checks_when_the_cdk_cli_found_an_account(aws, tmp_path, monkeypatch, capsys):
    import app

    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "123456789012")
    assert app.main({"profile": "multi-node-training", "job": "pf", "approve_hourly": "1000"}, outdir=str(tmp_path / "a")) == 0
    err = capsys.readouterr().err
    assert "preflight (7 checks; -c preflight=false skips them):" in err
    assert "  fail cdk bootstrap: us-east-1 is not bootstrapped for the CDK" in err  # moto: nothing bootstrapped
    assert "failed: the cluster may never launch until they are fixed" in err
    assert app.main({"profile": "multi-node-training", "job": "pf", "approve_hourly": "1000", "preflight": "false"}, outdir=str(tmp_path / "b")) == 0
    assert "preflight" not in capsys.readouterr().err
    monkeypatch.delenv("CDK_DEFAULT_ACCOUNT")
    assert app.main({"profile": "multi-node-training", "job": "pf", "approve_hourly": "1000"}, outdir=str(tmp_path / "c")) == 0
    assert "preflight: skipped (no AWS account from the CDK CLI: offline or no credentials)" in capsys.readouterr().err


def test_a_region_without_a_price_for_the_type_is_a_warning_with_the_way_out():
    # the sources price nothing in ap-southeast-4 on demand (dl_selector/data/prices.md), p5 not at all there
    got = preflight.region(_plan(region="ap-southeast-4"))
    assert got.level == "warn" and "no price on record for p5.48xlarge there" in got.found
    assert "max_price" in got.fix
    assert preflight.region(_plan()).level == "ok"
