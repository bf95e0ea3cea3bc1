"""A deployed job's CloudFormation stack, found by the job name users deploy with (-c job=NAME,
default the profile): the stack dl-NAME, or a training stack of any other name (a team's own app),
its outputs and what it keeps when deleted.

A stack's name is not proof that dl-launcher made it: `dl-data-lake` may be another team's. Every
verb acts only on a stack that names its job itself: the stack dl-JOB with the training stack's
output contract.OUTPUT_JOB, or, on stacks deployed before that output existed, the stack tag
contract.TAG_JOB that cdk deploy sets; a stack of any other name only with both, naming the same
job (the tag alone is anyone's to set on any stack; the output alone is any template's); a stack
Service Catalog launched from a dl-launcher product (SC-...-pp-...) by the job output, the
product's own output contract.OUTPUT_PRODUCT and Service Catalog's AutoTags, which no user can set
(aws: is reserved). Any other stack is neither listed, offered as the closest name, described,
nor touched (docs/security.md)."""
from __future__ import annotations

import re
from typing import Any, Optional

from constructs_lib.runtime import contract
from constructs_lib.runtime.contract import OUTPUT_CLUSTER, OUTPUT_JOB, OUTPUT_PRODUCT, OUTPUT_STATE_KEY, TAG_JOB
from dl_selector.errors import closest

from .errors import CliError

PREFIX = "dl-"
# The job names -c job= takes (dl_stacks/settings.py holds the same rule): the checkpoint prefix
# jobs/NAME and the stack dl-NAME.
JOB_NAME = re.compile(contract.JOB_NAME)
# Every status but DELETE_COMPLETE: a stack that still exists in some form.
LIVE = ("CREATE_IN_PROGRESS", "CREATE_FAILED", "CREATE_COMPLETE", "ROLLBACK_IN_PROGRESS", "ROLLBACK_FAILED",
        "ROLLBACK_COMPLETE", "DELETE_IN_PROGRESS", "DELETE_FAILED", "UPDATE_IN_PROGRESS",
        "UPDATE_COMPLETE_CLEANUP_IN_PROGRESS", "UPDATE_COMPLETE", "UPDATE_FAILED", "UPDATE_ROLLBACK_IN_PROGRESS",
        "UPDATE_ROLLBACK_FAILED", "UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS", "UPDATE_ROLLBACK_COMPLETE",
        "REVIEW_IN_PROGRESS", "IMPORT_IN_PROGRESS", "IMPORT_COMPLETE", "IMPORT_ROLLBACK_IN_PROGRESS",
        "IMPORT_ROLLBACK_FAILED", "IMPORT_ROLLBACK_COMPLETE")


class NoStack(CliError):
    """No live stack of that name (as opposed to one dl-launcher did not make)."""


def stack_name(job: str) -> str:
    return job if job.startswith(PREFIX) else f"{PREFIX}{job}"


# Service Catalog's AutoTags on every stack it provisions (the Service Catalog Administrator Guide,
# "AWS Service Catalog AutoTags"): keys under the reserved aws: prefix, which no user can set on a
# stack, nor remove.
SC_PROVISIONED_PRODUCT = "aws:servicecatalog:provisionedProductArn"
SC_PRODUCT = "aws:servicecatalog:productArn"


def job_of(stack: dict[str, Any]) -> Optional[str]:
    """The job a described stack says it runs, or None when dl-launcher did not make it (its name
    must be dl-<that job> too: a copied output on another stack names no job)."""
    tags = {t.get("Key"): t.get("Value") for t in stack.get("Tags") or []}
    said, tagged = output(stack, OUTPUT_JOB), tags.get(TAG_JOB)
    for job in (said, tagged):
        if job and stack.get("StackName") == f"{PREFIX}{job}":
            return job
    if said and said == tagged and JOB_NAME.fullmatch(said):  # any other name: the template's word and the tag
        return said
    if said and JOB_NAME.fullmatch(said) and provisioned_product(stack) and output(stack, OUTPUT_PRODUCT):
        return said  # launched by Service Catalog from a product that marks itself dl-launcher's
    return None


def provisioned_product(stack: dict[str, Any]) -> Optional[str]:
    """The provisioned product's id (pp-...) of a stack Service Catalog launched, by its AutoTags
    (both: the product's ARN and the provisioned product's), else None."""
    tags = {t.get("Key"): t.get("Value") for t in stack.get("Tags") or []}
    arn = tags.get(SC_PROVISIONED_PRODUCT)
    if not arn or not tags.get(SC_PRODUCT):
        return None
    last = arn.rsplit("/", 1)[-1]  # arn:aws:servicecatalog:REGION:ACCOUNT:stack/NAME/pp-...
    return last if last.startswith("pp-") else None


def cluster_of(stack: dict[str, Any]) -> str:
    """The cluster id the stack says its nodes carry (contract.TAG_CLUSTER); a training stack
    deployed before OUTPUT_CLUSTER existed was always dl-JOB, named after its construct id."""
    return output(stack, OUTPUT_CLUSTER) or stack["StackName"]


def state_key_of(stack: dict[str, Any]) -> str:
    """Where the stack's capacity controller keeps its state, as the stack says (else as before)."""
    return output(stack, OUTPUT_STATE_KEY) or contract.capacity_state_key(cluster_of(stack))


def check_job(job: str) -> None:
    """A job name as -c job= takes it (or its stack's name): one line otherwise, before any AWS call."""
    bare = job[len(PREFIX):] if job.startswith(PREFIX) else job
    if JOB_NAME.fullmatch(bare):
        return
    from dl_stacks.settings import show

    near = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", bare.lower())).strip("-")[:40].strip("-")
    raise CliError(f"job {show(job)}: a job name is 1-40 lower-case letters, digits and dashes, the -c job= it was "
                   "deployed with (default: the profile)" + (f"; closest: {near}" if near else ""))


def describe(cfn: Any, job: str, region: str) -> dict[str, Any]:
    """The job's stack; CliError naming the deployed jobs (closest first) when there is none, and
    refusing a stack of that name that dl-launcher did not make."""
    check_job(job)
    name = stack_name(job)
    bare = name[len(PREFIX):]
    refused = False
    try:
        (stack,) = cfn.describe_stacks(StackName=name)["Stacks"]
    except Exception as e:  # botocore's ClientError "Stack with id ... does not exist"
        if "does not exist" not in str(e):
            raise
    else:
        if job_of(stack) == bare:
            return stack
        refused = True
    stacks = _jobs_stacks(cfn)
    others = [s for s in stacks if s["StackName"] != name and job_of(s) == bare]
    if len(others) == 1:
        return others[0]
    if others:
        raise CliError(f"job {bare} in {region} is run by {len(others)} stacks ({', '.join(s['StackName'] for s in others)}):"
                       " nothing was done; delete all but one, or deploy each with its own -c job=")
    if refused:
        raise CliError(f"stack {name} in {region} was not made by dl-launcher (it has no output {OUTPUT_JOB} or "
                       f"stack tag {TAG_JOB} naming job {bare}): nothing was done to it; dl-launcher "
                       "acts only on the stacks it deploys")
    jobs = sorted({job_of(s) for s in stacks})
    near = closest(job, jobs, n=1)
    raise NoStack(f"no stack {name} in {region} (job {job!r})"
                   + (f"; closest: {near[0]}" if near else "")
                   + (f"; deployed jobs there: {', '.join(jobs)}" if jobs else "; no dl-launcher job is deployed there")
                   + "; --region picks another region")


def deployed_jobs(cfn: Any) -> list[str]:
    """The jobs of the region's stacks that dl-launcher made and that still exist."""
    return sorted({job_of(s) for s in _jobs_stacks(cfn)})


def _jobs_stacks(cfn: Any) -> list[dict[str, Any]]:
    """The region's live stacks that dl-launcher made, whatever their names (one pass over describe_stacks)."""
    return [stack for page in cfn.get_paginator("describe_stacks").paginate() for stack in page["Stacks"]
            if stack.get("StackStatus") in LIVE and job_of(stack) is not None]


def output(stack: dict[str, Any], key: str) -> Optional[str]:
    return next((o.get("OutputValue") for o in stack.get("Outputs") or [] if o.get("OutputKey") == key), None)


def deleted_stacks(cfn: Any, job: str) -> list[str]:
    """The ids of the deleted stacks that ran the job by the same rule as a live one (job_of), whatever
    their names (dl-JOB, a team's own, a Service Catalog launch), newest first. CloudFormation
    keeps a deleted stack's record, template and resources for 90 days, under its id: what the
    stack retained is found there, by CloudFormation's own word, never by a tag alone."""
    bare = stack_name(job)[len(PREFIX):]
    found = [s for page in cfn.get_paginator("list_stacks").paginate(StackStatusFilter=["DELETE_COMPLETE"])
             for s in page["StackSummaries"]]
    found.sort(key=lambda s: s.get("DeletionTime") or s.get("CreationTime"), reverse=True)
    return [s["StackId"] for s in found if _made_by_us(cfn, s["StackId"], bare)]


def _made_by_us(cfn: Any, stack_id: str, job: str) -> bool:
    """A deleted stack whose record names the job; where AWS keeps no outputs for it, with the
    outputs its template declares (a parameter's Ref read from the record's parameters)."""
    (stack,) = cfn.describe_stacks(StackName=stack_id)["Stacks"]
    if stack.get("Outputs"):
        return job_of(stack) == job
    body = cfn.get_template(StackName=stack_id)["TemplateBody"]
    if isinstance(body, str):
        import json
        body = json.loads(body)
    params = {p.get("ParameterKey"): p.get("ParameterValue") for p in stack.get("Parameters") or []}
    outputs = []
    for key, out in (body.get("Outputs") or {}).items():
        value = (out or {}).get("Value")
        if isinstance(value, dict) and set(value) == {"Ref"}:
            value = params.get(value["Ref"])
        if isinstance(value, str):
            outputs.append({"OutputKey": key, "OutputValue": value})
    return job_of({**stack, "Outputs": outputs}) == job
