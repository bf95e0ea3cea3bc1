"""A monthly AWS Budgets cost budget over the resources that carry one tag, told through SNS.

Budgets sees a tag only once it is activated as a cost allocation tag (Billing console, Cost
allocation tags; once per account, and it counts costs from then on). The subscribers' topic must
let budgets.amazonaws.com publish (NotificationTopic.allow_budgets)."""
from __future__ import annotations

from typing import Optional, Sequence

import aws_cdk.aws_budgets as budgets
from constructs import Construct

# (kind, percent): told at 80% and 100% of the month's actual spend and when the forecast passes it.
THRESHOLDS = (("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100))


def cost_budget(scope: Construct, construct_id: str, *, name: str, usd_per_month: float, tag_key: str,
                tag_value: str, topic_arn: str, emails: Sequence[str] = (),
                stop_topic_arn: Optional[str] = None) -> budgets.CfnBudget:
    """`stop_topic_arn`: where the 100%-actual notice goes instead (a notification takes one topic),
    e.g. a stopper's."""
    people = [budgets.CfnBudget.SubscriberProperty(subscription_type="EMAIL", address=e) for e in emails]
    notes = [budgets.CfnBudget.NotificationWithSubscribersProperty(
        notification=budgets.CfnBudget.NotificationProperty(
            notification_type=kind, comparison_operator="GREATER_THAN", threshold=pct, threshold_type="PERCENTAGE"),
        subscribers=[budgets.CfnBudget.SubscriberProperty(
            subscription_type="SNS",
            address=stop_topic_arn if stop_topic_arn and (kind, pct) == ("ACTUAL", 100) else topic_arn), *people])
        for kind, pct in THRESHOLDS]
    return budgets.CfnBudget(scope, construct_id, budget=budgets.CfnBudget.BudgetDataProperty(
        budget_name=name[:100], budget_type="COST", time_unit="MONTHLY",
        budget_limit=budgets.CfnBudget.SpendProperty(amount=usd_per_month, unit="USD"),
        cost_filters={"TagKeyValue": [f"user:{tag_key}${tag_value}"]}), notifications_with_subscribers=notes)
