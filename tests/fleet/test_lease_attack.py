"""The lease attack (issue 22): a process on a node writes the controller's state, holding the
lease for ever, stopping nothing, or crashing the controller. Shown impossible on the synthesized
policies (the node role is allowed nothing under the control prefix, and the bucket denies it
everything there), and harmless to the controller in moto if such a state appears anyway: it is
set aside and rebuilt from EC2, and teardown still terminates every node."""
from __future__ import annotations

import fnmatch
import json
import time

import pytest

from constructs_lib.fleet.state import LEASE_SECONDS, StateStore
from constructs_lib.runtime import contract
from tests.cdk_checks import listify, role_statements, training_template
from tests.constructs.userdata_text import evaluate
from tests.fleet.conftest import BUCKET, live_instances


# ---- the policies --------------------------------------------------------------------------------
def _matches(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return training_template(tmp_path_factory.mktemp("cdk.out"), "victim")


def test_no_node_may_write_or_read_the_controllers_state(template):
    resources = template["Resources"]
    (role,) = [k for k, r in resources.items() if r["Type"] == "AWS::IAM::Role"
               and "ec2.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])]
    bucket = next(k for k, r in resources.items() if r["Type"] == "AWS::S3::Bucket" and k.startswith("CheckpointsBucket"))
    state = f"<{bucket}.Arn>/{contract.capacity_state_key('dl-victim')}"
    allowed = []
    for s in role_statements(template, role):
        arns = [evaluate(x) if not isinstance(x, str) else x for x in listify(s["Resource"])]
        s3 = [a for a in listify(s["Action"]) if fnmatch.fnmatchcase("s3:PutObject", a)
              or fnmatch.fnmatchcase("s3:GetObject", a) or fnmatch.fnmatchcase("s3:DeleteObject", a)]
        if s["Effect"] == "Allow" and s3 and any(_matches(a, state) for a in arns):
            allowed.append(s)
    assert allowed == [], "an allow of the node role reaches the controller's state"
    # and the bucket's own policy denies the node role every action there, whatever it is granted later
    (policy,) = [r for r in resources.values() if r["Type"] == "AWS::S3::BucketPolicy"
                 and r["Properties"]["Bucket"] == {"Ref": bucket}]
    (deny,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
               if s.get("Sid") == "NodesNeverTouchTheControllersState"]
    assert deny["Effect"] == "Deny" and deny["Action"] == "s3:*"
    assert deny["Principal"] == {"AWS": {"Fn::GetAtt": [role, "Arn"]}}
    assert _matches(evaluate(deny["Resource"]), state)
    # the node's own grant is its job's prefix, and the state is not under it
    assert not contract.capacity_state_key("dl-victim").startswith("jobs/")


# ---- the controller, if such a state were written anyway ------------------------------------------
HOSTILE = {
    "far-future lease": lambda s: {**s, "lease_until": time.time() + 10 * 365 * 86400},
    "wrong types": lambda s: {**s, "stopped": "yes", "recent": ["i-0"], "lease_until": "never"},
    "not an object": lambda s: ["surprise"],
    "not JSON": lambda s: "{{{",
}


def _write(cloud, spec, body) -> None:
    text = body if isinstance(body, str) else json.dumps(body)
    cloud.s3.put_object(Bucket=BUCKET, Key=spec.state_key, Body=text.encode())


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_hostile_state_is_set_aside_and_teardown_still_stops_every_node(cloud, attack):
    spec = cloud.spec()
    ctl = cloud.controller(spec)
    cloud.reconcile(ctl)
    assert len(live_instances(cloud.raw)) == 4
    current = json.loads(cloud.s3.get_object(Bucket=BUCKET, Key=spec.state_key)["Body"].read())
    _write(cloud, spec, HOSTILE[attack](current))
    # the next reconcile neither crashes nor waits: it rebuilds from EC2 and keeps the cluster whole
    ctl = cloud.controller(spec)
    done = cloud.reconcile(ctl)
    kinds = [t.kind for t in done]
    assert "state-rebuilt" in kinds and "waiting" not in kinds, kinds
    assert len(live_instances(cloud.raw)) == 4
    # ... and teardown terminates every node of the cluster, the lease notwithstanding
    _write(cloud, spec, HOSTILE[attack](current))
    cloud.controller(spec).teardown("the stack is being deleted")
    assert live_instances(cloud.raw) == []
    assert StateStore(cloud.s3, BUCKET, spec.state_key).load().stopped is True


def test_a_lease_that_never_comes_free_cannot_keep_teardown_from_terminating(cloud, monkeypatch):
    spec = cloud.spec()
    cloud.reconcile(cloud.controller(spec))
    # a lease within what a run may take, renewed for ever (a holder stuck in a loop)
    monkeypatch.setattr(StateStore, "wait_for_lease", lambda self, clock, **kw: (_ for _ in ()).throw(
        TimeoutError(f"the lease on s3://{self.bucket}/{self.key} stayed held for {LEASE_SECONDS + 30:.0f} s")))
    done = cloud.controller(spec).teardown("the stack is being deleted")
    assert [t.kind for t in done] == ["torn-down"] and "without the lease" in done[0].reason
    assert live_instances(cloud.raw) == []
    assert StateStore(cloud.s3, BUCKET, spec.state_key).load().stopped is True
