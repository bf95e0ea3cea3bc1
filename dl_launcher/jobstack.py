"""A deployed job's CloudFormation stack, found by the job name users deploy with (-c job=NAME,
default the profile): the stack dl-NAME, its outputs and what it keeps when deleted."""
from __future__ import annotations

from typing import Any, Optional

from selector.errors import closest

from .errors import CliError

PREFIX = "dl-"


def stack_name(job: str) -> str:
    return job if job.startswith(PREFIX) else f"{PREFIX}{job}"


def describe(cfn: Any, job: str, region: str) -> dict[str, Any]:
    """The job's stack; CliError naming the deployed jobs (closest first) when there is none."""
    name = stack_name(job)
    try:
        (stack,) = cfn.describe_stacks(StackName=name)["Stacks"]
        return stack
    except Exception as e:  # botocore's ClientError "Stack with id ... does not exist"
        if "does not exist" not in str(e):
            raise
    jobs = deployed_jobs(cfn)
    near = closest(job, jobs, n=1)
    raise CliError(f"no stack {name} in {region} (job {job!r})"
                   + (f"; closest: {near[0]}" if near else "")
                   + (f"; deployed jobs there: {', '.join(jobs)}" if jobs else "; no dl-launcher job is deployed there")
                   + "; --region picks another region")


def deployed_jobs(cfn: Any) -> list[str]:
    """Job names of the dl- stacks that exist (not deleted) in the client's region."""
    live = ("CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "ROLLBACK_COMPLETE",
            "CREATE_IN_PROGRESS", "UPDATE_IN_PROGRESS", "DELETE_FAILED", "IMPORT_COMPLETE")
    names: list[str] = []
    for page in cfn.get_paginator("list_stacks").paginate(StackStatusFilter=list(live)):
        names += [s["StackName"][len(PREFIX):] for s in page["StackSummaries"] if s["StackName"].startswith(PREFIX)]
    return sorted(set(names))


def output(stack: dict[str, Any], key: str) -> Optional[str]:
    return next((o["OutputValue"] for o in stack.get("Outputs", []) if o["OutputKey"] == key), None)
