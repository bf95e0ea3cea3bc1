"""The README's main job, run the way a user tries their own project first (issue 34 item 5): the
real CDK CLI deploys multi-node-training into moto_server on 127.0.0.1 with a project that lives
outside the repository (`local_deploy.py --code DIR --command ... --keep`), its nodes run the job,
and, with moto kept running, `dl-launcher status`, `logs` and `destroy` work against it as the
script says; destroy keeps the checkpoint bucket. One multi-minute run proves both."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECRET = "tmp-project-not-a-real-key-0123456789"


def _read_until(proc: subprocess.Popen, lines: list[str], marker: str, timeout: float) -> None:
    def pump():
        for line in proc.stdout:
            lines.append(line)
    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not any(x.startswith(marker) for x in lines):
        assert proc.poll() is None or any(x.startswith(marker) for x in lines), "".join(lines)[-4000:]
        assert time.monotonic() < deadline, "".join(lines)[-4000:]
        time.sleep(0.5)


def test_your_own_project_from_outside_the_repository_with_moto_kept(tmp_path):
    from dl_selector.recommend import recommend
    pick = recommend("multi-node-training", spot=True).pick.instance_type  # the selector's spot pick (the profile launches on spot), whichever it is today
    project = tmp_path / "my-project"  # not under the repository
    shutil.copytree(ROOT / "examples" / "train_project", project)
    assert ROOT not in project.resolve().parents
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)  # this checkout's packages, whatever the venv was installed from
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "local_deploy.py"), "--code", str(project), "--command", "dl-torchrun train.py",
         "--setup", "pip install -r requirements.txt", "--env", "STEPS=60,LR=0.05",
         "--secrets", f"WANDB_API_KEY={SECRET}", "--nodes", "2", "--keep"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        _read_until(proc, lines, "stop it: Ctrl-C here, or kill ", timeout=900)
        out = "".join(lines)
        assert "stack dl-multi-node-training: CREATE_COMPLETE" in out
        # the controller's own code, with the spec the stack gave its Lambda: the whole cluster at once,
        # then a lost node replaced by the same type
        assert f'"kind": "launched", "instance_type": "{pick}", "reason": "2 x {pick} (spot)' in out
        assert f"cluster dl-multi-node-training: 2 of 2 running, types ['{pick}']\n" in out
        assert f'"kind": "replaced", "instance_type": "{pick}"' in out
        assert "instances (2):" in out and out.count("cluster=dl-multi-node-training") == 2
        lt_lines = [line for line in out.splitlines() if line.strip().startswith("LaunchTemplate_")]
        assert lt_lines and all("IMDS tokens required" in line for line in lt_lines)
        from dl_selector.catalog import load_catalog
        efa = load_catalog().get(pick).max_efa_interfaces  # every EFA interface the type takes, one per card
        assert any(f"{efa} EFA interfaces on cards [" in line for line in lt_lines), lt_lines
        assert "output ClusterCostPerHour: 2 x" in out and "output CheckpointBucket:" in out
        # local=true into moto: no approval asked, and the summary says why
        assert "approval: not needed (-c local=true into moto on this machine: nothing is billed)" in out
        # the CDK CLI published the node bundle into moto's S3; the node role may read that object only
        (bundle,) = [line for line in out.splitlines() if line.startswith("node bundle in staging bucket: ")]
        url = bundle.split()[5]
        assert url.startswith("s3://cdk-local-staging-123456789012/assets/") and url.endswith(".zip")
        assert "install.sh present, 6 units" in bundle  # raid, efa, agent, logs, job, monitor
        assert "output NotificationTopic: arn:aws:sns:" in out and "output ResumeCommand: aws lambda invoke" in out
        arn = "arn:aws:s3:::" + url[len("s3://"):]
        # the node role reads three objects there, each by its key: the bundle, your code, the job definition
        (code,) = [x.split()[5] for x in out.splitlines() if x.startswith("your code in staging bucket: ")]
        (definition,) = [x.split()[5] for x in out.splitlines() if x.startswith("job definition in staging bucket: ")]
        (grant,) = [x for x in out.splitlines() if "may, in cdk-local-staging-123456789012: " in x]
        objects = sorted("arn:aws:s3:::" + u[len("s3://"):] for u in (code, definition)) + [arn]
        assert grant.endswith(f"s3:GetObject on {sorted(objects)}"), grant
        # the project from the tmp directory on the nodes: code, setup, env and the secret arrive, the job runs
        # across both nodes and its lines come back from CloudWatch Logs
        assert f"code: {project}: 4 files" in out
        assert "job unit on every node ended: [0, 0] (0: the job finished)" in out
        assert "code on i-" in out and f": .dlignore, README.md, requirements.txt, train.py ({project} less" in out
        assert "[setup] Requirement already satisfied: numpy" in out
        assert "]: WANDB_API_KEY is set (37 characters)" in out and "secret value in the log: no" in out
        assert "rank0]: step 59 loss " in out, "STEPS=60 from --env reached the job; lines prefixed with node and rank"
        assert out.count("[dl-launcher] generation 1 ended: finished") == 2
        assert "output LogsCommand: dl-launcher logs multi-node-training --follow" in out
        # --keep: the printed environment points dl-launcher at the kept moto
        (export,) = [x for x in out.splitlines() if x.startswith("  unset AWS_PROFILE AWS_SESSION_TOKEN; export ")]
        cli_env = {k: v for k, v in env.items()}
        cli_env.update(dict(kv.split("=", 1) for kv in export.split("; export ", 1)[1].split()))
        endpoint = cli_env["AWS_ENDPOINT_URL"]
        assert re.fullmatch(r"http://localhost:\d+", endpoint)

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "dl_launcher", *args], cwd=ROOT, env=cli_env,
                                  capture_output=True, text=True, timeout=600)

        status = cli("status", "multi-node-training")
        assert status.returncode == 0 and f"2 x {pick}" in status.stdout + status.stderr, status.stdout + status.stderr
        assert "cost: $" in status.stdout
        logs = cli("logs", "multi-node-training", "--since", "1d")
        assert logs.returncode == 0 and "rank0]: step 59 loss " in logs.stdout, logs.stdout[-2000:] + logs.stderr
        assert SECRET not in logs.stdout
        gone = cli("destroy", "multi-node-training")
        text = gone.stdout + gone.stderr
        assert gone.returncode == 0 and "deleted stack dl-multi-node-training" in text, text
        assert "kept bucket dl-multi-node-training-checkpointsbucket" in text and "object versions" in text
        import boto3
        kw = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="local",
                  aws_secret_access_key="local")
        assert boto3.client("ec2", **kw).describe_launch_templates()["LaunchTemplates"] == []
        assert any("checkpointsbucket" in b["Name"] for b in boto3.client("s3", **kw).list_buckets()["Buckets"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    assert rc == 0, "".join(lines)[-3000:]
    assert "".join(lines).rstrip().endswith("moto stopped: everything it held is gone")
