"""The least-privilege CloudFormation execution policy for `cdk deploy` of dl-launcher stacks:
docs/deployer-policy.json, written from the same table the portfolio's launch role is built from
(dl_stacks/launch_role.py PERMISSIONS: one row per resource type the templates declare; a type
without a row stops the synth, and tests check every synthesized training template against it).

The CDK's bootstrap gives CloudFormation AdministratorAccess unless told otherwise; with this
policy created as a managed policy, `cdk bootstrap --cloudformation-execution-policies ARN`
holds every deploy to these actions, on resources named after dl-launcher stacks (dl-*).

    python scripts/deployer_policy.py            # print it
    python scripts/deployer_policy.py --write    # docs/deployer-policy.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "deployer-policy.json"
# The CDK's default bootstrap qualifier: Lambda code and the node bundle are read from its bucket.
ASSETS = "arn:aws:s3:::cdk-hnb659fds-assets-*"


def policy() -> dict:
    from dl_stacks.launch_role import PERMISSIONS, permissions_for

    statements = []
    for resource, actions in permissions_for(PERMISSIONS).items():
        # Service Catalog names its stacks SC-...; the CDK app names them dl-<job>, and
        # CloudFormation names their resources after the stack.
        arn = (resource.replace("SC-*", "dl-*").replace("sc-*", "dl-*")
               .format(p="aws", r="*", a="*")) if resource != "*" else "*"
        sid = "".join(ch for ch in (arn.split(":")[2].title() + arn.rsplit(":", 1)[-1].split("/")[0].title())
                      if ch.isalnum()) if arn != "*" else "NamedByAws"
        statements.append({"Sid": sid[:100], "Effect": "Allow", "Action": list(actions), "Resource": arn})
    statements.append({"Sid": "CdkAssets", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": f"{ASSETS}/*"})
    seen: dict[str, int] = {}
    for s in statements:  # Sids must be unique
        n = seen.get(s["Sid"], 0)
        seen[s["Sid"]] = n + 1
        if n:
            s["Sid"] = f"{s['Sid']}{n + 1}"
    return {"Version": "2012-10-17", "Statement": statements}


def render() -> str:
    return json.dumps(policy(), indent=1) + "\n"


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    a = p.parse_args()
    if a.write:
        OUT.write_text(render())
        print(f"wrote {OUT.relative_to(ROOT)} ({len(json.dumps(policy(), separators=(',', ':')))} characters minified)")
    else:
        print(render(), end="")
