"""The supervisor's decisions as pure functions (constructs_lib/runtime/decisions.py): each rule
pinned at its edges in microseconds, where a two-node drill takes a minute and cannot reach them.
Each test is named for the rule it holds; a mutation of the rule fails the test of that name."""
from __future__ import annotations

import pytest

from constructs_lib.runtime.decisions import (
    askers, suspects,
    Target, agreed_outcome, container_env, error_signature, exit_outcome, failures_after, gives_up, ready_to_propose,
    repeated_error,
    rendezvous_target, run_environment, settle_seconds, settled_outcome, stop_reason,
)


# ---- counting failures ----------------------------------------------------------------------------
def test_a_failure_after_a_newer_checkpoint_starts_the_count_again_at_one():
    assert failures_after("failed", 2, resume_step=40, last_resume=20) == 1


def test_a_failure_without_a_newer_checkpoint_adds_one():
    assert failures_after("failed", 2, resume_step=20, last_resume=20) == 3
    assert failures_after("failed", 1, resume_step=None, last_resume=None) == 2  # from scratch, twice


def test_a_first_checkpoint_after_runs_from_scratch_is_progress():
    assert failures_after("failed", 2, resume_step=0, last_resume=None) == 1


@pytest.mark.parametrize("outcome", ["finished", "interrupted", "peer-lost"])
def test_any_outcome_but_failed_clears_the_count(outcome):
    assert failures_after(outcome, 2, resume_step=20, last_resume=20) == 0


def test_the_job_gives_up_at_max_failures_not_before():
    assert not gives_up("failed", 2, 3)
    assert gives_up("failed", 3, 3)
    assert not gives_up("peer-lost", 5, 3)


# ---- the same outcome on every node -----------------------------------------------------------------
def test_peer_lost_is_failed_when_another_node_recorded_a_failure_and_names_it_and_its_exit():
    """Not "a node joined or left generation 2", which reads like a network fault: which node failed and how."""
    assert agreed_outcome("peer-lost", "a node joined or left generation 2", "i-a", {"i-c": "exit 5", "i-b": "exit 1"}) \
        == ("failed", "the command failed on i-b (exit 1); i-c (exit 5); this node's run was stopped for it")
    assert agreed_outcome("peer-lost", "x", "i-a", {"i-b": ""})[1] == \
        "the command failed on i-b; this node's run was stopped for it"


def test_a_nodes_own_failure_record_does_not_turn_peer_lost_into_failed():
    assert agreed_outcome("peer-lost", "x", "i-a", {"i-a": "exit 1"}) == ("peer-lost", "x")


@pytest.mark.parametrize("outcome", ["finished", "interrupted", "failed"])
def test_only_peer_lost_is_turned_by_failure_records(outcome):
    assert agreed_outcome(outcome, "d", "i-a", {"i-b": "exit 1"}) == (outcome, "d")


# ---- the same error twice ------------------------------------------------------------------------------
OOM = ["step 40 loss 2.31", "Traceback (most recent call last):", '  File "train.py", line 88, in <module>',
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 79.11 GiB total)"]


def test_the_same_crash_on_another_rank_or_run_has_the_same_signature():
    again = [line.replace("GPU 3", "GPU 5").replace("line 88", "line 88") for line in OOM[1:]] + [""]
    assert error_signature(OOM) == error_signature(again)


def test_another_error_has_another_signature():
    other = OOM[:-1] + ["RuntimeError: NCCL error in: ProcessGroupNCCL.cpp, unhandled system error"]
    assert error_signature(OOM) != error_signature(other)


def test_a_silent_failure_repeats_nothing():
    assert error_signature([]) == error_signature(["", "  "]) == ""
    assert not repeated_error("", "")
    assert repeated_error(error_signature(OOM), error_signature(OOM))


def test_the_first_repeat_of_the_same_error_from_the_same_step_gives_up():
    assert gives_up("failed", 2, 3, repeated=True)
    assert not gives_up("failed", 1, 3, repeated=True)  # a newer checkpoint came between: it made progress
    assert not gives_up("failed", 2, 3, repeated=False)  # another error: one more try


# ---- how a run ended ------------------------------------------------------------------------------------
def test_interrupted_wins_over_exit_zero():
    """The ranks that stop together for a notice exit 0: the record, read first, says the job is not done."""
    assert exit_outcome(0, {"interrupted": 40}) == ("interrupted", "termination notice; saved step 40")
    assert exit_outcome(1, {"interrupted": 40})[0] == "interrupted"


def test_exit_zero_without_a_notice_is_finished():
    assert exit_outcome(0, {}) == ("finished", "")


def test_a_non_zero_exit_waits_for_the_clusters_word():
    assert exit_outcome(1, {}) is None


def test_a_run_stops_for_activity_in_the_next_generation_or_a_gone_member():
    assert stop_reason(4, True, []) == "a node joined or left generation 4"
    assert stop_reason(4, False, ["i-b", "i-a"]) == "i-a, i-b gone"
    assert stop_reason(4, False, []) == ""


def test_settling_lasts_past_the_urgent_heartbeat_limit_and_two_liveness_looks():
    assert settle_seconds(poll=2, liveness_poll=10, stale=30) == 35
    assert settle_seconds(poll=2, liveness_poll=0, stale=0) == 6  # no heartbeats: three polls


def test_an_exit_is_peer_lost_when_the_cluster_shows_a_loss():
    assert settled_outcome(1, 3, True, [], ["i-b"]) == ("peer-lost", "exit 1; a node joined or left generation 3")
    assert settled_outcome(1, 3, False, ["i-b"], ["i-b"]) == ("peer-lost", "exit 1; i-b gone")


def test_an_exit_is_the_jobs_failure_once_every_peer_beat_a_full_second_after_it():
    assert settled_outcome(1, 3, False, [], ["i-b", "i-c"], {"i-b": 101.0, "i-c": 101.0}, 100.0) == \
        ("failed", "exit 1")


def test_a_beat_in_the_same_second_as_the_exit_proves_nothing():
    """LastModified has whole seconds: a beat stamped 100 may be from before an exit at 100.4."""
    assert settled_outcome(1, 3, False, [], ["i-b"], {"i-b": 100.0}, 100.0) is None
    assert settled_outcome(1, 3, False, [], ["i-b", "i-c"], {"i-b": 101.0}, 100.0) is None  # i-c silent


def test_without_peers_or_beats_an_exit_settles_only_by_time():
    assert settled_outcome(1, 3, False, [], [], {}, 100.0) is None
    assert settled_outcome(1, 3, False, [], ["i-b"]) is None


# ---- a run's environment ----------------------------------------------------------------------------------
def test_the_deployers_env_never_shadows_the_runtimes_names():
    env = run_environment({"PATH": "/bin", "DL_RESUME_STEP": "5", "PYTHONPATH": "/u"},
                          {"MASTER_ADDR": "evil", "DL_CHECKPOINT_DIR": "/evil", "LR": "0.1"},
                          {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "16"}, {"DL_RESUME_STEP": "40"},
                          lib_python="/opt/dl/python", checkpoint_dir="/ck", notice_file="/run/n", notice_signal="SIGUSR1")
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["DL_CHECKPOINT_DIR"] == "/ck" and env["LR"] == "0.1"
    assert env["DL_RESUME_STEP"] == "40" and env["PYTHONPATH"] == "/opt/dl/python:/u"
    assert env["DL_NOTICE_FILE"] == "/run/n" and env["DL_NOTICE_SIGNAL"] == "SIGUSR1"


def test_a_stale_resume_step_from_the_units_env_is_dropped():
    env = run_environment({"DL_RESUME_STEP": "5", "DL_RESUME_FROM": "/old"}, {}, {}, {}, lib_python="/p",
                          checkpoint_dir="/ck", notice_file="/n", notice_signal="SIGUSR1")
    assert "DL_RESUME_STEP" not in env and "DL_RESUME_FROM" not in env and env["PYTHONPATH"] == "/p"


def test_a_container_gets_the_deployers_names_the_runtimes_and_the_region_only():
    env = {"HOME": "/root", "PATH": "/bin", "LR": "0.1", "DL_CHECKPOINT_DIR": "/ck", "NODE_RANK": "1",
           "AWS_REGION": "us-east-1", "NCCL_DEBUG": "INFO", "FI_PROVIDER": "efa", "AWS_SECRET_ACCESS_KEY": "x"}
    assert container_env(env, {"LR": "0.1"}) == {"LR": "0.1", "DL_CHECKPOINT_DIR": "/ck", "NODE_RANK": "1",
                                                 "AWS_REGION": "us-east-1", "NCCL_DEBUG": "INFO", "FI_PROVIDER": "efa"}


# ---- rendezvous ----------------------------------------------------------------------------------------------
def test_a_node_runs_the_newest_plan_that_holds_it_when_it_has_not_run_it():
    assert rendezvous_target(3, ["i-a", "i-b"], "i-a", last_ran=2, newest_set_aside=False) == Target("run", 3)


def test_a_redeploy_since_the_plan_joins_the_next_generation_instead():
    assert rendezvous_target(3, ["i-a"], "i-a", 2, False, redeployed=True) == Target("rejoin", 4)


def test_a_plan_this_node_already_ran_is_never_run_again():
    assert rendezvous_target(3, ["i-a", "i-b"], "i-a", last_ran=3, newest_set_aside=False) == Target("join", 4)


def test_a_node_outside_a_full_newer_plan_checks_whether_to_wait_as_a_spare():
    assert rendezvous_target(3, ["i-b", "i-c"], "i-a", last_ran=0, newest_set_aside=False) == Target("spare-check", 4)
    assert rendezvous_target(3, ["i-b", "i-c"], "i-a", last_ran=3, newest_set_aside=False) == Target("join", 4)


def test_a_forming_generation_is_joined():
    assert rendezvous_target(3, None, "i-a", last_ran=2, newest_set_aside=False) == Target("join", 3)
    assert rendezvous_target(0, None, "i-a", last_ran=0, newest_set_aside=False) == Target("join", 1)


def test_a_generation_whose_plan_was_set_aside_is_spent():
    assert rendezvous_target(3, None, "i-a", last_ran=2, newest_set_aside=True) == Target("join", 4)


def test_a_plan_waits_for_unaccounted_previous_members_until_the_grace_is_over():
    assert not ready_to_propose(True, ["i-old"], waited=10, grace=600)
    assert ready_to_propose(True, ["i-old"], waited=600, grace=600)
    assert ready_to_propose(True, [], waited=0, grace=600)
    assert not ready_to_propose(False, [], waited=10_000, grace=600)


def test_a_failure_that_alternates_between_nodes_reaches_the_limit_on_both():
    """Node a's command fails in odd generations, b's in even ones; each node sees its own failure
    every other time and "peer lost" (stopped by the failing node's next join) in between. Counted
    where it was seen, neither would reach three: a restart loop for ever. Counted from the
    cluster's failure records, both give up after generation 3."""
    counts, given_up = {"a": 0, "b": 0}, {}
    for g in range(1, 10):
        failing = "a" if g % 2 else "b"
        for node in ("a", "b"):
            seen = ("failed", "exit 5") if node == failing else ("peer-lost", "a node joined or left")
            outcome, _ = agreed_outcome(*seen, node, {failing: "exit 5"})
            counts[node] = failures_after(outcome, counts[node], resume_step=None, last_resume=None)
            if gives_up(outcome, counts[node], 3) and node not in given_up:
                given_up[node] = g
        if len(given_up) == 2:
            break
    assert given_up == {"a": 3, "b": 3}


def test_a_node_that_cannot_write_the_plan_yet_looks_at_half_the_liveness_period():
    from constructs_lib.runtime.decisions import waiting_poll
    assert waiting_poll(2.0, 10.0, complete=False) == 5.0
    assert waiting_poll(2.0, 10.0, complete=True) == 2.0  # enough nodes: the plan is for this node to write
    assert waiting_poll(2.0, 2.0, complete=False) == 2.0  # never faster than the poll


# ---- who asks EC2, and about whom (issue 37) -----------------------------------------------------
def test_one_asker_normally_and_two_under_urgency_so_a_dead_first_node_never_blocks():
    fresh = {"i-a", "i-b", "i-c"}  # i-a died a second ago: its last beat is still fresh
    assert askers(["i-c", "i-b", "i-a"], fresh, recorded=set(), urgent=False) == ["i-a"]
    assert askers(["i-c", "i-b", "i-a"], fresh, recorded=set(), urgent=True) == ["i-a", "i-b"]
    assert askers(["i-c", "i-b", "i-a"], fresh, recorded={"i-a"}, urgent=True) == ["i-b", "i-c"]
    assert askers(["i-a", "i-z"], {"i-a"}, recorded=set(), urgent=True) == ["i-a"], "a silent node never asks"


def test_an_urgent_suspect_is_asked_about_whatever_its_beat_unless_it_beat_after_the_exit():
    beats, now = {"i-a": 99.0, "i-b": 101.0, "i-c": 100.0}, 102.0
    assert suspects(["i-a", "i-b"], set(), beats, now, stale=30) == set(), "fresh beats, nothing urgent"
    assert suspects(["i-a", "i-b", "i-c"], set(), beats, now, stale=30, urgent={"i-a", "i-b", "i-c"}) == \
        {"i-a", "i-b", "i-c"}, "right after the exit nobody is proven alive"
    assert suspects(["i-a", "i-b", "i-c"], set(), beats, now, stale=30, urgent={"i-a", "i-b", "i-c"},
                    since=100.0) == {"i-a", "i-c"}, "i-b beat a full second after the exit; i-c in its second"
    assert suspects(["i-a", "i-b"], {"i-a"}, beats, now, stale=30, urgent={"i-a"}) == set(), "recorded: not asked"
    assert suspects(["i-a", "i-d"], set(), beats, now, stale=30) == {"i-d"}, "never beat: stale"
