"""`dl-launcher status` says why the generation before the running one ended when a node's command
hung (runtime/stall.py writes "hung: no step for N s at step S" into the node's failure record),
and the node's own health tag, which status lists beside it."""
from __future__ import annotations

from constructs_lib.runtime import contract
from constructs_lib.runtime.cluster import Member, Plan
from tests.fleet.test_job_end import _nodes_records, _running, _setup, _status


def test_status_says_a_node_hung_in_the_generation_before(cloud, capsys):
    spec, ctl = _setup(cloud)
    ctl().reconcile()
    a, b = sorted(_running(cloud))
    records = _nodes_records(cloud)
    records.record_failure(1, b, "hung: no step for 300 s at step 41")
    records.record_failure(1, a, "exit 1")  # a failure of another kind is not a hang
    cloud.raw.create_tags(Resources=[b], Tags=[{"Key": contract.TAG_HEALTH,
                                                "Value": "ok: hung: no step for 300 s at step 41; quick checks passed"}])
    records.propose(Plan(2, (Member(a, "10.0.0.1"), Member(b, "10.0.0.2")), resume_step=None))
    out = _status(capsys)
    assert out.startswith("job: running (generation 2, 2 node(s)); no complete checkpoint yet\n"
                          f"  generation 1 ended on {b}: hung: no step for 300 s at step 41\n"), out
    assert f"ended on {a}" not in out
    assert "health ok: hung: no step for 300 s at step 41; quick checks passed" in out
