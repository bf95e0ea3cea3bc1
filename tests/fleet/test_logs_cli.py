"""`python -m constructs_lib.fleet logs`: a job's lines from every node without knowing the group
name, oldest first, in moto; a job that has no log group is one line, exit 2."""
from __future__ import annotations

import argparse
import time

import boto3

from constructs_lib.fleet import cli
from constructs_lib.runtime import contract


def test_logs_prints_every_nodes_lines_oldest_first(aws, capsys):
    logs = boto3.client("logs", region_name="us-east-1")
    group = contract.job_log_group("dl-llm")
    logs.create_log_group(logGroupName=group)
    now = int(time.time() * 1000)
    for stream, lines in {"i-0aaa": ["[dl-launcher] generation 1: running", "step 0 loss 2.1"],
                          "i-0bbb": ["[setup] Successfully installed numpy"]}.items():
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[
            {"timestamp": now - 1000 * (10 - i) - (500 if stream == "i-0bbb" else 0), "message": m}
            for i, m in enumerate(lines)])
    assert cli.main(["logs", "--job", "llm", "--region", "us-east-1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [x.split(" ", 1)[1] for x in out] == ["i-0bbb [setup] Successfully installed numpy",
                                                 "i-0aaa [dl-launcher] generation 1: running", "i-0aaa step 0 loss 2.1"]
    # following: new lines only, each once
    a = argparse.Namespace(job=None, cluster="dl-llm", since=3600.0, follow=True, region="us-east-1")
    logs.put_log_events(logGroupName=group, logStreamName="i-0aaa", logEvents=[{"timestamp": now, "message": "step 1"}])
    assert cli._logs(a, logs, poll=0.01, rounds=2) == 0
    assert capsys.readouterr().out.count("step 1") == 1


def test_logs_of_a_job_without_a_group_is_one_line(aws, capsys):
    assert cli.main(["logs", "--job", "nothing", "--region", "us-east-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no log group /dl-launcher/dl-nothing/job in us-east-1" in err
    assert cli.main(["logs", "--job", "x", "--since", "forever"]) == 2
    assert "'forever' is not a duration" in capsys.readouterr().err
