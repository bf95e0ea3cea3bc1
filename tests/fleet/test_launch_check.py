"""Issue 35: the deploy-time proof that the controller may launch. Every option's CreateFleet, as
a real launch sends it, with DryRun=True: EC2's DryRunOperation passes; UnauthorizedOperation (after
the pauses a new role needs to reach IAM) or any other error fails the custom resource with AWS's
reason, decoded where STS allows. AWS's answers come from botocore's Stubber (the shapes are the
EC2 and STS models'), the custom resource round trip from moto and a local response URL."""
from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from constructs_lib.fleet import CapacityOption, ClusterSpec, handler
from constructs_lib.fleet.instances import fleet_request
from constructs_lib.fleet.launch_check import RESOURCE_TYPE, RETRY_PAUSES, LaunchDenied, check_launch
from tests.fleet.test_handler import Context, cfn, cfn_event  # noqa: F401 - cfn is a fixture

SPEC = ClusterSpec(cluster="llm", nodes=2, market="spot", max_price=50.0, subnet_ids=("subnet-0a1b2c3d4e5f60718", "subnet-0b1b2c3d4e5f60718"),
                   options=(CapacityOption("p5.48xlarge", "lt-0123456789abcdef0", "3", 40.0),
                            CapacityOption("p4d.24xlarge", "lt-0fedcba9876543210", "1", 20.0)),
                   state_bucket="dl-state-bucket", state_key="_control/llm/capacity-state.json",
                   stack="arn:aws:cloudformation:us-east-1:123456789012:stack/dl-llm/1")
ENCODED = "AbCdEf0123-encoded_message"
DENIED = f"You are not authorized to perform this operation. Encoded authorization failure message: {ENCODED}"


def _clients():
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    sts = boto3.client("sts", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return ec2, Stubber(ec2), sts, Stubber(sts)


def _dry_run(option: CapacityOption) -> dict:
    return {**fleet_request(SPEC, option, SPEC.nodes, SPEC.subnet_ids, SPEC.nodes), "DryRun": True}


def test_dry_run_operation_for_every_option_is_the_proof():
    ec2, stub, sts, _ = _clients()
    for option in SPEC.options:
        stub.add_client_error("create_fleet", "DryRunOperation", "Request would have succeeded, but DryRun flag is set.",
                              expected_params=_dry_run(option))
    with stub:
        summary = check_launch(ec2, SPEC, sts=sts, sleep=lambda s: pytest.fail("no pause when allowed"))
        stub.assert_no_pending_responses()
    assert summary == "the controller's role may launch p5.48xlarge, p4d.24xlarge (CreateFleet DryRun)"


def test_a_denial_that_stays_fails_with_the_decoded_reason():
    ec2, stub, sts, sts_stub = _clients()
    option = SPEC.options[0]
    for _ in range(len(RETRY_PAUSES) + 1):
        stub.add_client_error("create_fleet", "UnauthorizedOperation", DENIED, http_status_code=403,
                              expected_params=_dry_run(option))
    decoded = {"allowed": False, "explicitDeny": True, "context": {
        "action": "ec2:CreateFleet", "resource": "arn:aws:ec2:us-east-1:123456789012:instance/*"}}
    sts_stub.add_response("decode_authorization_message", {"DecodedMessage": json.dumps(decoded)},
                          expected_params={"EncodedMessage": ENCODED})
    pauses = []
    with stub, sts_stub, pytest.raises(LaunchDenied) as e:
        check_launch(ec2, SPEC, sts=sts, sleep=pauses.append)
    assert pauses == list(RETRY_PAUSES), "a new role's policy gets time to reach IAM"
    assert str(e.value) == ("the controller's role may not launch p5.48xlarge from lt-0123456789abcdef0: UnauthorizedOperation: "
                            "ec2:CreateFleet on arn:aws:ec2:us-east-1:123456789012:instance/* is denied: "
                            "an explicit Deny matches it")


def test_a_denial_sts_will_not_decode_quotes_the_encoded_message():
    ec2, stub, sts, sts_stub = _clients()
    for _ in range(len(RETRY_PAUSES) + 1):
        stub.add_client_error("create_fleet", "UnauthorizedOperation", DENIED, http_status_code=403)
    sts_stub.add_client_error("decode_authorization_message", "AccessDenied", "not authorized", http_status_code=403)
    with stub, sts_stub, pytest.raises(LaunchDenied) as e:
        check_launch(ec2, SPEC, sts=sts, sleep=lambda s: None)
    assert str(e.value).endswith(f"UnauthorizedOperation; decode with aws sts decode-authorization-message "
                                 f"--encoded-message {ENCODED}")


def test_a_denial_that_clears_as_the_role_reaches_iam_passes():
    ec2, stub, sts, _ = _clients()
    stub.add_client_error("create_fleet", "UnauthorizedOperation", DENIED, http_status_code=403)
    for _ in SPEC.options:
        stub.add_client_error("create_fleet", "DryRunOperation", "Request would have succeeded")
    pauses = []
    with stub:
        check_launch(ec2, SPEC, sts=sts, sleep=pauses.append)
    assert pauses == [RETRY_PAUSES[0]]


def test_any_other_error_fails_at_once_with_awss_words():
    ec2, stub, sts, _ = _clients()
    stub.add_client_error("create_fleet", "DryRunOperation", "Request would have succeeded")
    stub.add_client_error("create_fleet", "InvalidLaunchTemplateId.NotFound",
                          "The specified launch template, with template ID lt-0fedcba9876543210, does not exist.")
    with stub, pytest.raises(LaunchDenied) as e:
        check_launch(ec2, SPEC, sts=sts, sleep=lambda s: pytest.fail("only a denial is asked again"))
    assert "may not launch p4d.24xlarge from lt-0fedcba9876543210: InvalidLaunchTemplateId.NotFound" in str(e.value)
    assert "with template ID lt-0fedcba9876543210, does not exist" in str(e.value)


def test_an_endpoint_that_launches_on_a_dry_run_proves_nothing():
    ec2, stub, sts, _ = _clients()
    stub.add_response("create_fleet", {"FleetId": "fleet-1", "Instances": [], "Errors": []})
    with stub, pytest.raises(LaunchDenied, match="nothing is proven"):
        check_launch(ec2, SPEC, sts=sts)


def _check_event(url: str, kind: str) -> dict:
    return {**cfn_event(url, kind), "ResourceType": RESOURCE_TYPE, "LogicalResourceId": "LaunchCheck"}


def test_the_custom_resource_on_moto_answers_success_and_launches_nothing(cloud, cfn, monkeypatch):  # noqa: F811
    """moto answers a DryRun CreateFleet with DryRunOperation, as EC2 does for an allowed call."""
    url, answers = cfn
    spec = cloud.spec()
    monkeypatch.setenv(handler.SPEC_ENV, spec.to_json())
    assert handler.handle(_check_event(url, "Create"), Context())["status"] == "SUCCESS"
    (answer,) = answers
    assert answer["body"]["Status"] == "SUCCESS" and answer["body"]["PhysicalResourceId"] == "llm-7b-launch-check"
    assert "may launch p5.48xlarge" in answer["body"]["Reason"]
    assert cloud.types() == {}, "a dry run launches nothing"
    assert handler.handle(_check_event(url, "Delete"), Context())["status"] == "SUCCESS"


def test_the_custom_resource_fails_the_deploy_with_the_reason(cfn, monkeypatch):  # noqa: F811
    url, answers = cfn
    monkeypatch.setenv(handler.SPEC_ENV, SPEC.to_json())
    ec2, stub, _sts, _ = _clients()
    for _ in range(len(RETRY_PAUSES) + 1):
        stub.add_client_error("create_fleet", "UnauthorizedOperation", DENIED, http_status_code=403)
    monkeypatch.setattr(handler, "_clients", lambda: (ec2, None))
    monkeypatch.setattr("constructs_lib.fleet.launch_check.time.sleep", lambda s: None)
    monkeypatch.setattr("boto3.client", lambda *a, **k: None)  # no STS here: the encoded message is quoted
    with stub:
        result = handler.handle(_check_event(url, "Create"), Context())
    assert result["status"] == "FAILED"
    (answer,) = answers
    assert answer["body"]["Status"] == "FAILED"
    assert answer["body"]["Reason"].startswith("LaunchDenied: the controller's role may not launch p5.48xlarge from "
                                               "lt-0123456789abcdef0: UnauthorizedOperation; decode with aws sts")
