"""Two stacks given the same job name (two products launched as "llm-7b", a product and a plain
stack) run side by side in one account and region: each stack's controller launches, replaces and
tears down only the nodes carrying its own stack's id, never the other's (moto)."""
from __future__ import annotations

import dataclasses

from constructs_lib.fleet.instances import list_cluster
from constructs_lib.runtime import contract
from tests.fleet.conftest import CLUSTER, live_instances

STACK_A = "arn:aws:cloudformation:us-east-1:123456789012:stack/dl-llm-7b/11111111-1111-1111-1111-111111111111"
STACK_B = "arn:aws:cloudformation:us-east-1:123456789012:stack/SC-123456789012-pp-abcdef/22222222-2222-2222-2222-222222222222"


def _ids(cloud, stack: str) -> set[str]:
    return {i["InstanceId"] for i in live_instances(cloud.raw)
            if {"Key": contract.TAG_STACK, "Value": stack} in i.get("Tags", [])}


def test_two_same_named_clusters_never_touch_each_others_instances(cloud):
    a = cloud.spec(stack=STACK_A)
    b = dataclasses.replace(cloud.spec(stack=STACK_B), state_key=contract.capacity_state_key(CLUSTER) + ".b")
    ctl_a, ctl_b = cloud.controller(a), cloud.controller(b)
    cloud.reconcile(ctl_a)
    cloud.reconcile(ctl_b)
    mine_a, mine_b = _ids(cloud, STACK_A), _ids(cloud, STACK_B)
    assert len(mine_a) == len(mine_b) == 4 and not mine_a & mine_b
    # the readable name alone would have listed all eight as one cluster
    assert len(list_cluster(cloud.raw, CLUSTER)) == 8 and len(list_cluster(cloud.raw, CLUSTER, STACK_A)) == 4

    # a node of A is lost: A replaces it; B neither counts it nor launches for it
    lost = sorted(mine_a)[0]
    cloud.raw.terminate_instances(InstanceIds=[lost])
    cloud.reconcile(ctl_b)
    assert _ids(cloud, STACK_B) == mine_b
    cloud.reconcile(ctl_a)
    assert len(_ids(cloud, STACK_A)) == 4 and lost not in _ids(cloud, STACK_A)

    # A is torn down (its stack deleted, its idle guard, its budget): B's nodes stay
    ctl_a.teardown("the stack is being deleted")
    assert _ids(cloud, STACK_A) == set() and _ids(cloud, STACK_B) == mine_b
    done = cloud.reconcile(ctl_b)
    assert _ids(cloud, STACK_B) == mine_b and not [t for t in done if t.kind.startswith("terminated")]
    ctl_b.teardown("the stack is being deleted")
    assert live_instances(cloud.raw) == []
