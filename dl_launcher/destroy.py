"""`dl-launcher destroy JOB`: delete the job's stack through CloudFormation and say what stays.

The stack's own teardown resource terminates the cluster first (as on `cdk destroy`). The
checkpoint bucket and its access-log bucket are RETAIN: a deleted stack must never take a month
of training with it. `--delete-checkpoints` empties and removes them (every version and delete
marker: the checkpoint bucket is versioned), after the user types the job name or passes --yes;
once the stack is gone, it finds them in CloudFormation's record of the deleted stack (jobstack.deleted_stacks).
A stack Service Catalog launched is terminated through Service Catalog (its provisioned product),
never deleted under it: a stack deleted directly leaves the provisioned product in error.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from .errors import CliError
from .jobstack import NoStack, deleted_stacks, describe, provisioned_product

# S3 Standard in us-east-1, first 50 TB (the S3 pricing page): what a kept checkpoint costs.
S3_USD_PER_GB_MONTH = 0.023


def retained(cfn: Any, name: str) -> list[tuple[str, str, str]]:
    """(logical id, type, physical id) of the resources the template keeps on delete (`name`: a live
    stack's name, or a deleted stack's id)."""
    body = cfn.get_template(StackName=name, TemplateStage="Processed")["TemplateBody"]
    if isinstance(body, str):
        import json
        body = json.loads(body)
    keep = {k for k, r in body.get("Resources", {}).items() if r.get("DeletionPolicy") in ("Retain", "RetainExceptOnCreate")}
    out = []
    for page in cfn.get_paginator("list_stack_resources").paginate(StackName=name):
        for r in page["StackResourceSummaries"]:
            if r["LogicalResourceId"] in keep and r.get("PhysicalResourceId"):
                out.append((r["LogicalResourceId"], r["ResourceType"], r["PhysicalResourceId"]))
    return sorted(out, key=lambda r: r[0])


def bucket_size(s3: Any, bucket: str) -> tuple[int, int]:
    """(objects, bytes) over every version: what the bucket bills for."""
    n = size = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        for v in page.get("Versions", []):
            n, size = n + 1, size + v.get("Size", 0)
    return n, size


def empty_and_delete(s3: Any, bucket: str) -> int:
    """Delete every version and delete marker, then the bucket; the count of versions removed."""
    removed = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        keys = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys[i:i + 1000], "Quiet": True})
            removed += len(keys[i:i + 1000])
    s3.delete_bucket(Bucket=bucket)
    return removed


QUIET_NOTE = 60.0  # seconds without a new stack event before destroy says it is still waiting


def _latest_events(cfn: Any, stack_id: str) -> list[dict]:
    """The newest page of the stack's events (newest first): one call per poll, whatever the
    stack's history."""
    return cfn.describe_stack_events(StackName=stack_id).get("StackEvents", [])


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"[{m}:{s:02d}]"


def destroy(cfn: Any, s3: Any, job: str, region: str, *, delete_checkpoints: bool, confirm: Callable[[str], bool],
            timeout: float = 3600.0, poll: float = 10.0, say: Callable[[str], Any] = print,
            catalog: Any = None) -> int:
    """`catalog`: a Service Catalog client, for a stack Service Catalog launched."""
    try:
        stack = describe(cfn, job, region)
    except NoStack:
        gone = deleted_stacks(cfn, job) if delete_checkpoints else []
        if not gone:
            raise
        return _left_behind(cfn, s3, job, region, gone, confirm=confirm, say=say)
    name = stack["StackName"]
    if stack["StackStatus"].endswith("_IN_PROGRESS") and stack["StackStatus"] != "DELETE_IN_PROGRESS":
        raise CliError(f"stack {name} is {stack['StackStatus']}: wait for it to finish, then destroy it")
    kept = retained(cfn, name)
    buckets = [p for _l, t, p in kept if t == "AWS::S3::Bucket"]
    if delete_checkpoints and not confirm(name):
        raise CliError(f"not confirmed: nothing was deleted (type {job} at the prompt, or pass --yes)")
    seen = {ev["EventId"] for ev in _latest_events(cfn, stack["StackId"])}
    product = provisioned_product(stack)
    if product is None:
        say(f"deleting stack {name} in {region} (the cluster is terminated first by its teardown resource)")
        cfn.delete_stack(StackName=name)
    else:
        import uuid
        if catalog is None:
            import boto3
            catalog = boto3.client("servicecatalog", region_name=region)
        say(f"terminating Service Catalog provisioned product {product} in {region}: it deletes stack {name} "
            "(the cluster first, by its teardown resource)")
        catalog.terminate_provisioned_product(ProvisionedProductId=product, TerminateToken=str(uuid.uuid4()))
    started = time.monotonic()
    deadline = started + timeout
    quiet_since = started
    while True:
        try:
            status = cfn.describe_stacks(StackName=stack["StackId"])["Stacks"][0]["StackStatus"]
        except Exception as e:
            if "does not exist" in str(e):
                break
            raise
        now = time.monotonic()
        fresh = [ev for ev in _latest_events(cfn, stack["StackId"]) if ev["EventId"] not in seen]
        for ev in reversed(fresh):  # CloudFormation lists the newest first
            seen.add(ev["EventId"])
            reason = ev.get("ResourceStatusReason")
            say(f"  {_elapsed(now - started)} {ev.get('LogicalResourceId', '?')} ({ev.get('ResourceType', '?')}): "
                f"{ev.get('ResourceStatus', '?')}" + (f" - {' '.join(reason.split())[:200]}" if reason else ""))
        if fresh:
            quiet_since = now
        elif now - quiet_since >= QUIET_NOTE:
            say(f"  {_elapsed(now - started)} still {status} (instances take a few minutes to terminate)")
            quiet_since = now
        if status == "DELETE_COMPLETE":
            break
        if status == "DELETE_FAILED":
            reasons = [ev.get("ResourceStatusReason", "") for ev in
                       cfn.describe_stack_events(StackName=stack["StackId"])["StackEvents"]
                       if ev.get("ResourceStatus") == "DELETE_FAILED"][:3]
            raise CliError(f"CloudFormation could not delete {name}: {'; '.join(reasons) or 'see its events'}; "
                           "fix that and run destroy again")
        if time.monotonic() > deadline:
            raise CliError(f"{name} is still {status} after {timeout:.0f} s: CloudFormation goes on; run destroy "
                           "again to follow it")
        time.sleep(poll)
    say(f"deleted stack {name} in {_elapsed(time.monotonic() - started)}")
    for logical, kind, physical in kept:
        if kind == "AWS::S3::Bucket" and delete_checkpoints:
            say(f"deleted bucket {physical} ({empty_and_delete(s3, physical):,} object versions)")
        elif kind == "AWS::S3::Bucket":
            n, size = bucket_size(s3, physical)
            say(f"kept bucket {physical} ({logical}): {n:,} object versions, {size / 1e9:,.2f} GB, about "
                f"${size / 1e9 * S3_USD_PER_GB_MONTH:,.2f}/month in S3 Standard")
        else:
            say(f"kept {kind} {physical} ({logical}): its template says Retain")
    if buckets and not delete_checkpoints:
        say(f"the checkpoints stay so that a new deploy of {job} can resume; to remove them later, empty and "
            "delete the buckets above in the S3 console (they are versioned: `aws s3 rb --force` leaves old "
            f"versions), or next time run `dl-launcher destroy {job} --delete-checkpoints`")
    return 0


def _left_behind(cfn: Any, s3: Any, job: str, region: str, stack_ids: list[str], *, confirm: Callable[[str], bool],
                 say: Callable[[str], Any]) -> int:
    """--delete-checkpoints once the stack is gone: the buckets CloudFormation says the job's deleted
    stacks retained, the ones that still exist, with the same confirmation as before."""
    from dl_core.aws import not_found

    buckets: list[tuple[str, str, str]] = []  # (the deleted stack's name, logical id, bucket)
    for stack_id in stack_ids:
        for logical, kind, physical in retained(cfn, stack_id):
            if kind != "AWS::S3::Bucket" or any(physical == b for _, _, b in buckets):
                continue
            try:
                s3.head_bucket(Bucket=physical)
            except Exception as e:  # noqa: BLE001 - deleted already: nothing to do; anything else is said
                if not_found(e):
                    continue
                raise
            # A stack's id is arn:...:stack/NAME/UUID: the name it had, whatever the job's.
            buckets.append((stack_id.split("/")[1] if stack_id.count("/") >= 2 else stack_id, logical, physical))
    if not buckets:
        names = ", ".join(dict.fromkeys(i.split("/")[1] if i.count("/") >= 2 else i for i in stack_ids))
        say(f"stack {names} in {region} is deleted and none of the buckets it kept is left: nothing to delete")
        return 0
    for name, logical, physical in buckets:
        n, size = bucket_size(s3, physical)
        say(f"stack {name} is deleted; it kept bucket {physical} ({logical}): {n:,} object versions, {size / 1e9:,.2f} GB")
    if not confirm(buckets[0][0]):
        raise CliError(f"not confirmed: nothing was deleted (type {job} at the prompt, or pass --yes)")
    for _name, _logical, physical in buckets:
        say(f"deleted bucket {physical} ({empty_and_delete(s3, physical):,} object versions)")
    return 0

