"""The README's main job: the real CDK CLI deploys multi-node-training into moto_server on
127.0.0.1, the summary shows what exists, and dl-launcher destroy keeps the checkpoint bucket."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_local_deploy_of_multi_node_training():
    from selector.recommend import recommend
    pick = recommend("multi-node-training").pick.instance_type  # the selector's, whichever it is today
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"
    r = subprocess.run([sys.executable, "scripts/local_deploy.py", "--profile", "multi-node-training"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-2000:]
    assert "stack dl-multi-node-training: CREATE_COMPLETE" in out
    # the controller's own code, with the spec the stack gave its Lambda: the whole cluster at once,
    # then a lost node replaced by the same type
    assert f'"kind": "launched", "instance_type": "{pick}", "reason": "2 x {pick} (spot)' in out
    assert f"cluster dl-multi-node-training: 2 of 2 running, types ['{pick}']\n" in out
    assert f'"kind": "replaced", "instance_type": "{pick}"' in out
    assert f"2 of 2 running, types ['{pick}']; replaced i-" in out and out.count(": True\n") >= 1
    assert "instances (2):" in out, "two nodes, both tagged with the cluster id"
    assert out.count("cluster=dl-multi-node-training") == 2
    assert '"kind": "torn-down"' in out
    lt_lines = [line for line in out.splitlines() if line.strip().startswith("LaunchTemplate_")]
    assert lt_lines and all("IMDS tokens required" in line for line in lt_lines)
    from selector.catalog import load_catalog
    efa = load_catalog().get(pick).max_efa_interfaces  # every EFA interface the type takes, one per card
    assert any(f"{efa} EFA interfaces on cards [" in line for line in lt_lines), lt_lines
    assert "output ClusterCostPerHour: 2 x" in out and "output CheckpointBucket:" in out
    # the CDK CLI published the node bundle into moto's S3; the node role may read that object only
    (bundle,) = [line for line in out.splitlines() if line.startswith("node bundle in staging bucket: ")]
    url = bundle.split()[5]
    assert url.startswith("s3://cdk-local-staging-123456789012/assets/") and url.endswith(".zip")
    assert "install.sh present, 6 units" in bundle  # raid, efa, agent, logs, job, monitor
    # observability: the idle guard's function, the dashboard and the topic were created in moto
    assert "output NotificationTopic: arn:aws:sns:" in out and "output ResumeCommand: aws lambda invoke" in out
    arn = "arn:aws:s3:::" + url[len("s3://"):]
    # the node role reads three objects there, each by its key: the bundle, your code, the job definition
    (code,) = [x.split()[5] for x in out.splitlines() if x.startswith("your code in staging bucket: ")]
    (definition,) = [x.split()[5] for x in out.splitlines() if x.startswith("job definition in staging bucket: ")]
    (grant,) = [x for x in out.splitlines() if "may, in cdk-local-staging-123456789012: " in x]
    objects = sorted("arn:aws:s3:::" + u[len("s3://"):] for u in (code, definition)) + [arn]
    assert grant.endswith(f"s3:GetObject on {sorted(objects)}"), grant
    # your own project on the nodes: booted from the deployed user data, code, setup, env and a secret arrive,
    # the job runs across both nodes and its lines come back from CloudWatch Logs through the CLI verb
    assert "job unit on every node ended: [0, 0] (0: the job finished)" in out
    assert "code on i-" in out and ": .dlignore, README.md, requirements.txt, train.py (" in out
    assert "[setup] Requirement already satisfied: numpy" in out
    assert "]: WANDB_API_KEY is set (36 characters)" in out and "secret value in the log: no" in out
    assert "rank0]: step 59 loss " in out, "STEPS=60 from -c env reached the job; lines prefixed with node and rank"
    assert out.count("[dl-launcher] generation 1 ended: finished") == 2
    assert "your code in staging bucket: s3://cdk-local-staging-123456789012/assets/" in out
    assert "output LogsCommand: aws logs tail /dl-launcher/dl-multi-node-training/job --follow" in out
    assert "deleted stack dl-multi-node-training" in out, "dl-launcher destroy, through moto's CloudFormation"
    assert "kept bucket dl-multi-node-training-checkpointsbucket" in out and "object versions" in out
    assert "checkpoint bucket kept (RemovalPolicy.RETAIN): dl-multi-node-training-checkpointsbucket" in out
    assert "launch templates left: 0" in out
