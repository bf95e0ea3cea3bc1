"""A portfolio product, locally: its template synthesized as a plain stack (`-c portfolio=NAME
-c product=PROFILE`), deployed with the real CDK CLI into moto_server on 127.0.0.1 with the
parameters a user would enter and the cost tags Service Catalog's TagOptions would put on the
stack; then the capacity controller, with the spec CloudFormation chose for those parameters,
launches the cluster, and the nodes and volumes carry the cost tags.

moto has no Service Catalog provisioning (no CloudFormation resource types for portfolios or
products, no launch roles, no template constraints) and does not check parameter AllowedValues or
template rules: tests/test_portfolio.py evaluates those against the catalog's prices.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_deploy import (REGION, cdk, cluster_instances, controller, local_env, log, start_moto,  # noqa: E402
                          synth_into_moto)

TAGS = {"team": "ml-research", "project": "llm", "cost-centre": "cc-1001"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--portfolio", default="platform")
    p.add_argument("--product", default="multi-node-training")
    p.add_argument("--profiles-file")
    p.add_argument("--parameter", action="append", default=[], metavar="KEY=VALUE",
                   help="a product parameter as a user enters it (JobName, InstanceType, Market, Nodes, Command)")
    a = p.parse_args(argv)

    import boto3

    from constructs_lib.fleet.instances import stack_tags

    server, port = start_moto()
    endpoint, env = local_env(port, REGION)
    out = Path(tempfile.mkdtemp(prefix="dl-product-"))
    stack = f"dl-{a.portfolio}-{a.product}"
    try:
        log(f"moto_server on {endpoint} (in-process)")
        extra = ["-c", f"profiles_file={a.profiles_file}"] if a.profiles_file else []
        template = synth_into_moto(["-c", f"portfolio={a.portfolio}", "-c", f"product={a.product}", *extra],
                                   stack=stack, out=out, env=env)
        log("parameters: " + "; ".join(f"{k} in {v['AllowedValues']}" for k, v in template["Parameters"].items()
                                       if "AllowedValues" in v))
        params = [x for kv in a.parameter for x in ("--parameters", f"{stack}:{kv}")]
        tags = [x for k, v in TAGS.items() for x in ("--tags", f"{k}={v}")]
        cdk("deploy", "--app", str(out), "--require-approval", "never", "--method=direct", "--no-previous-parameters",
            *params, *tags, stack, env=env)
        ctl, spec = controller(stack, REGION)
        cfn = boto3.client("cloudformation", region_name=REGION)
        ctl._cost_tags = lambda: stack_tags(cfn, spec.stack)  # as the Lambda handler wires it
        log(f"spec chosen by CloudFormation: cluster {spec.cluster}, {spec.nodes} x {spec.options[0].instance_type} "
            f"{spec.market}, alternates {[o.instance_type for o in spec.options[1:]]}, "
            f"ceiling ${spec.max_price:.2f}/h per node")
        ctl.reconcile()
        nodes = cluster_instances(REGION, spec.cluster)
        ec2 = boto3.client("ec2", region_name=REGION)
        for i in nodes:
            tags = {t["Key"]: t["Value"] for t in i["Tags"]}
            vols = [b["Ebs"]["VolumeId"] for b in i.get("BlockDeviceMappings", [])]
            vtags = [{t["Key"]: t["Value"] for t in v.get("Tags", [])}
                     for v in ec2.describe_volumes(VolumeIds=vols)["Volumes"]] if vols else []
            log(f"node {i['InstanceId']} {i['InstanceType']}: "
                + ", ".join(f"{k}={tags.get(k)}" for k in (*TAGS, "dl-launcher:product", "dl-launcher:cluster"))
                + f"; volumes {len(vols)} with cost tags: {all(all(v.get(k) == x for k, x in TAGS.items()) for v in vtags)}")
        log(f"cluster {spec.cluster}: {len(nodes)} of {spec.nodes} running")
        ctl.teardown()
        cdk("destroy", "--app", str(out), "--force", stack, env=env)
        return 0 if len(nodes) == spec.nodes else 1
    finally:
        shutil.rmtree(out, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
