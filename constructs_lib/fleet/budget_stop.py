"""The budget stopper: AWS Budgets tells a product's stop topic that the product's monthly budget
is spent; this stops every cluster of that product, through each capacity controller's own
`stop` command (it terminates the nodes and launches nothing until `resume`; the node agents have
uploaded each complete checkpoint as it was written, so the job resumes from the newest).

Standard library and boto3 only (Lambda). The function's environment maps each stop topic's ARN
to the product tag value it stands for (DL_BUDGET_TOPICS, JSON); a message from any other topic
is ignored, so one function serves every opted-in product of a portfolio.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

from ..runtime.contract import FUNCTION_CONTROLLER, TAG_FUNCTION, TAG_PRODUCT

TOPICS_ENV = "DL_BUDGET_TOPICS"
ALERTS_ENV = "DL_BUDGET_ALERTS"  # the portfolio's budget topic: told what was stopped


def controllers(tagging: Any, product: str) -> list[str]:
    """ARNs of the capacity controllers of every launch of `product` (portfolio/profile)."""
    found: list[str] = []
    kw: dict[str, Any] = {"TagFilters": [{"Key": TAG_PRODUCT, "Values": [product]},
                                         {"Key": TAG_FUNCTION, "Values": [FUNCTION_CONTROLLER]}],
                          "ResourceTypeFilters": ["lambda:function"]}
    while True:
        page = tagging.get_resources(**kw)
        found += [r["ResourceARN"] for r in page.get("ResourceTagMappingList", [])]
        if not page.get("PaginationToken"):
            return found
        kw["PaginationToken"] = page["PaginationToken"]


def stop_product(tagging: Any, lam: Any, product: str, reason: str) -> dict[str, str]:
    """Invoke `stop` on each controller of the product (asynchronously: a teardown may take
    minutes). Returns {function ARN: 'stopping' or the error}; one failure does not spare the rest."""
    outcome = {}
    for arn in controllers(tagging, product):
        try:
            lam.invoke(FunctionName=arn, InvocationType="Event",
                       Payload=json.dumps({"dl-launcher": "stop", "reason": reason}).encode())
            outcome[arn] = "stopping"
        except Exception as e:
            outcome[arn] = f"not stopped: {' '.join(str(e).split())[:200]}"
    return outcome


def handle(event: dict[str, Any], context: Any, *, tagging: Optional[Any] = None,
           lam: Optional[Any] = None, sns_client: Optional[Any] = None) -> dict[str, Any]:
    topics = json.loads(os.environ.get(TOPICS_ENV) or "{}")
    if tagging is None or lam is None or sns_client is None:
        import boto3
        tagging, lam = boto3.client("resourcegroupstaggingapi"), boto3.client("lambda")
        sns_client = boto3.client("sns")
    done: dict[str, Any] = {}
    for record in event.get("Records", []):
        sns = record.get("Sns") or {}
        product = topics.get(sns.get("TopicArn", ""))
        if product is None:
            continue
        reason = f"the monthly budget of {product} is spent (AWS Budgets: {(sns.get('Subject') or '').strip()[:120]})"
        done[product] = stop_product(tagging, lam, product, reason)
        alerts = os.environ.get(ALERTS_ENV)
        if alerts:
            lines = [f"dl-launcher: {reason}; stopping {len(done[product])} cluster(s):"]
            lines += [f"  {arn}: {what}" for arn, what in sorted(done[product].items())] or ["  none was running"]
            lines.append("  each starts again with its ResumeCommand output once the budget allows")
            sns_client.publish(TopicArn=alerts, Subject=f"dl-launcher: budget of {product} spent, clusters stopped"[:100],
                               Message="\n".join(lines))
    print(json.dumps({"budget-stop": done}))
    return done
