"""Observability: the CloudWatch agent, the node monitor, the dashboard, alarms and the idle guard."""
