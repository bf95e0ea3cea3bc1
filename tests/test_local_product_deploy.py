"""A portfolio product's template, deployed by the real CDK CLI into moto_server on 127.0.0.1 with
the parameters a user enters and the stack tags Service Catalog's TagOptions would set: the spec
CloudFormation chose (Fn::If over the product's conditions) launches exactly the chosen type,
market and node count, and every node and volume carries the cost tags."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_product_deploys_with_user_parameters_and_launches_what_was_chosen():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"
    params = ["JobName=llm-ft", "InstanceType=p5.48xlarge", "Market=on-demand", "Nodes=2",
              "Command=dl-torchrun train.py --epochs 3"]
    r = subprocess.run([sys.executable, "scripts/local_product_deploy.py", "--product", "multi-node-training",
                        *(x for p in params for x in ("--parameter", p))], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-2000:]
    # the user's choices, not the profile's pick (p6-b200.48xlarge on spot), reached the controller
    assert "spec chosen by CloudFormation: cluster llm-ft, 2 x p5.48xlarge on-demand" in out
    assert '"kind": "launched", "instance_type": "p5.48xlarge", "reason": "2 x p5.48xlarge (on-demand)' in out
    nodes = [line for line in out.splitlines() if line.startswith("node i-")]
    assert len(nodes) == 2
    for line in nodes:
        assert "team=ml-research, project=llm, cost-centre=cc-1001" in line
        assert "dl-launcher:product=platform/multi-node-training, dl-launcher:cluster=llm-ft" in line
        assert "with cost tags: True" in line
    assert ".NodeCostPerHour = USD 55.0400 per node-hour at most (p5.48xlarge on-demand" in out
    assert "cluster llm-ft: 2 of 2 running" in out and '"kind": "torn-down"' in out
