"""The idle guard as deployed: its function's settings come from the catalog, its schedule, and
its role allows every AWS call a real run makes (recorded from a run against moto: the IAM action
of each call, per the service authorization reference) and holds the dangerous ones to the cluster.
Context switches turn it off; Neuron clusters get no guard and a warning."""
from __future__ import annotations

import json

import aws_cdk as cdk
import boto3
import pytest
from aws_cdk.assertions import Template

from constructs_lib.fleet.handler import COMMAND_KEY
from constructs_lib.fleet.idle_watch import GUARD_ENV, GuardSettings
from dl_stacks.settings import from_context
from dl_stacks.training_stack import TrainingStack

# IAM actions of the API operations whose names differ from the action (AWS service
# authorization reference: s3 ListObjectsV2 -> s3:ListBucket, HeadObject -> s3:GetObject).
S3_ACTIONS = {"ListObjectsV2": "s3:ListBucket", "HeadObject": "s3:GetObject", "GetObject": "s3:GetObject",
              "PutObject": "s3:PutObject"}
# p5en.48xlarge (multi-node-training's pick on spot, its default market: p6-b300 has no spot price):
# 8 NVIDIA H200 GPUs (https://aws.amazon.com/ec2/instance-types/p5/).
H200_GPUS = 8


def _stack(ctx):
    app = cdk.App()
    stack = TrainingStack.for_settings(app, from_context(ctx), quiet=True)
    return stack, Template.from_stack(stack)


@pytest.fixture(scope="module")
def multi_node():
    return _stack({"profile": "multi-node-training"})


def _guard_function(t: Template) -> dict:
    fns = [r for r in t.find_resources("AWS::Lambda::Function").values()
           if r["Properties"]["Handler"] == "constructs_lib.fleet.idle_watch.handle"]
    assert len(fns) == 1
    return fns[0]


def _resolved_env(stack, fn) -> GuardSettings:
    raw = fn["Properties"]["Environment"]["Variables"][GUARD_ENV]
    if isinstance(raw, dict):  # Fn::Join with tokens (the topic ARN, the bucket): put placeholders in
        raw = "".join(p if isinstance(p, str) else "TOKEN" for p in raw["Fn::Join"][1])
    return GuardSettings(**json.loads(raw))


def _guard_statements(t: Template) -> list[dict]:
    policies = [p for name, p in t.find_resources("AWS::IAM::Policy").items() if "IdleGuard" in name]
    assert len(policies) == 1
    return policies[0]["Properties"]["PolicyDocument"]["Statement"]


def test_settings_come_from_the_catalog_and_the_context(multi_node):
    stack, t = multi_node
    assert _guard_function(t)["Properties"]["ReservedConcurrentExecutions"] == 1  # never two stops at once
    s = _resolved_env(stack, _guard_function(t))
    assert s.job == "dl-multi-node-training" and s.action == "stop"
    # No command: a development cluster, warned 15 min before the stop, in the job's log group too.
    assert s.interactive and s.warning_minutes == 15 and s.job_log_group == "TOKEN"  # the JobLogs group's Ref
    assert s.expected_gpus == {"p5en.48xlarge": H200_GPUS}
    assert s.config == {"threshold_pct": 5.0, "idle_minutes": 30, "grace_minutes": 20.0}
    assert s.checkpoint_prefix == "jobs/multi-node-training"
    rules = [r for name, r in t.find_resources("AWS::Events::Rule").items() if "IdleGuard" in name]
    assert [r["Properties"]["ScheduleExpression"] for r in rules] == ["rate(5 minutes)"]
    out = t.to_json()["Outputs"]
    assert out["IdleGuard"]["Value"].startswith("interactive: stop after 30 min with no Session Manager session")
    # The resume command's payload is the one the controller's handler takes.
    command = "".join(p if isinstance(p, str) else "FN" for p in out["ResumeCommand"]["Value"]["Fn::Join"][1])
    payload = json.loads(command.split("--payload '")[1].split("'")[0])
    assert payload == {COMMAND_KEY: "resume"} and "--function-name FN " in command


def _allowed(statements: list[dict], action: str) -> list[dict]:
    out = []
    for st in statements:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        if st["Effect"] == "Allow" and any(a == action or (a.endswith("*") and action.startswith(a[:-1])) for a in actions):
            out.append(st)
    return out


def test_the_role_allows_every_call_a_real_run_makes(multi_node, aws):
    """Run the guard end to end against moto (an idle cluster it stops), record each API call,
    and find an Allow for each in the synthesized role."""
    import tests.fleet.test_idle_watch as drill
    from constructs_lib.runtime import contract
    from tests.fleet.conftest import BUCKET, CLUSTER, Cloud

    calls: set[str] = set()

    def record(model, **kw):
        service = model.service_model.service_name if hasattr(model, "service_model") else ""
        calls.add(f"{service}:{model.name}")

    session = boto3.Session()
    session.events.register("before-call", lambda model, **kw: record(model))
    boto3.DEFAULT_SESSION = session  # every boto3.client(...) of the drill and the guard
    try:
        cloud = Cloud()
        sns, sqs = boto3.client("sns", region_name="us-east-1"), boto3.client("sqs", region_name="us-east-1")
        arn = sns.create_topic(Name="t")["TopicArn"]
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        ctl, ids, now, kw = drill._setup(cloud)
        logs = boto3.client("logs", region_name="us-east-1")
        logs.create_log_group(logGroupName="/dl-launcher/llm-7b/job")
        for i in ids:
            drill.Metrics().node(i, now)
            drill.Metrics().put(contract.NS_JOB, contract.M_SESSIONS, {contract.DIM_JOB: CLUSTER, contract.DIM_INSTANCE: i},
                                [(now - 60 * m, 0.0) for m in range(40, -1, -1)])
        calls.clear()
        # An interactive cluster's warning (its record, the job log, the topic), then a job cluster's stop.
        warned = drill._run(cloud, ctl, (sns, arn, sqs, url), {**kw, "interactive": True, "warning_minutes": 15,
                                                               "state_bucket": BUCKET, "job_log_group": "/dl-launcher/llm-7b/job"},
                            now, logs=logs)
        assert warned["step"] == "warn" and warned["notice_failed"] == [], warned
        result = drill._run(cloud, ctl, (sns, arn, sqs, url), kw, now)
    finally:
        boto3.DEFAULT_SESSION = None
    assert result["stop"] and result["stopped"]["terminated"], result
    statements = _guard_statements(multi_node[1])
    needed = set()
    for c in calls:
        service, op = c.split(":")
        prefix = {"monitoring": "cloudwatch"}.get(service, service)
        needed.add(S3_ACTIONS[op] if prefix == "s3" else f"{prefix}:{op}")
    needed -= {"sqs:ReceiveMessage", "sqs:CreateQueue", "sns:CreateTopic", "logs:CreateLogGroup"}  # the test's own
    assert {"cloudwatch:GetMetricData", "ssm:SendCommand", "ec2:TerminateInstances", "sns:Publish",
            "logs:PutLogEvents", "s3:PutObject"} <= needed, needed
    missing = sorted(a for a in needed if not _allowed(statements, a))
    assert not missing, f"the guard's role lacks {missing}"


def test_the_dangerous_calls_are_held_to_the_cluster(multi_node):
    statements = _guard_statements(multi_node[1])
    (term,) = _allowed(statements, "ec2:TerminateInstances")
    stack = {"Ref": "AWS::StackId"}  # the stack's own id: a same-named cluster of another stack is not its
    assert term["Condition"] == {"StringEquals": {"ec2:ResourceTag/dl-launcher:cluster": "dl-multi-node-training",
                                                  "ec2:ResourceTag/dl-launcher:stack": stack}}
    send = _allowed(statements, "ssm:SendCommand")
    docs = [s for s in send if "document" in json.dumps(s["Resource"])]
    nodes = [s for s in send if "instance" in json.dumps(s["Resource"])]
    assert len(docs) == 1 and "AWS-RunShellScript" in json.dumps(docs[0]["Resource"]) and "Condition" not in docs[0]
    assert len(nodes) == 1 and nodes[0]["Condition"] == {
        "StringEquals": {"ssm:resourceTag/dl-launcher:cluster": "dl-multi-node-training",
                         "ssm:resourceTag/dl-launcher:stack": stack}}
    reads = _allowed(statements, "s3:GetObject")
    assert any("MANIFEST.json" in json.dumps(s["Resource"]) for s in reads)
    assert not any(json.dumps(s["Resource"]).endswith('/*"]}') for s in reads), "never the checkpoints' weights"
    # It writes two objects only, both under the controller's prefix the nodes may not write.
    (writes,) = _allowed(statements, "s3:PutObject")
    keys = sorted(json.dumps(r).split("/")[-1].rstrip('"]}') for r in writes["Resource"])
    assert keys == ["capacity-state.json", "idle-guard.json"] and all("/_control/" in json.dumps(r) for r in writes["Resource"])


@pytest.mark.parametrize("ctx, topic, guard", [
    ({"profile": "multi-node-training", "idle_guard": "false"}, True, False),
    ({"profile": "multi-node-training", "observability": "false", "idle_guard": "false"}, False, False),
    ({"profile": "dev-prototyping"}, True, True),  # every profile gets a guard (issue 34): an interactive one here
    ({"profile": "inference"}, True, True),
    ({"profile": "dev-prototyping", "observability": "false", "idle_guard": "false"}, False, False),
])
def test_context_switches(ctx, topic, guard):
    _, t = _stack(ctx)
    assert bool(t.find_resources("AWS::SNS::Topic")) == topic
    handlers = [r["Properties"]["Handler"] for r in t.find_resources("AWS::Lambda::Function").values()]
    assert ("constructs_lib.fleet.idle_watch.handle" in handlers) == guard


def test_a_given_topic_is_used_and_none_is_made():
    arn = "arn:aws:sns:us-east-1:123456789012:ml-alerts"
    stack, t = _stack({"profile": "multi-node-training", "alarm_topic": arn})
    # The only key is the job log group's (an interactive cluster's guard warns there too).
    assert not t.find_resources("AWS::SNS::Topic") and list(t.find_resources("AWS::KMS::Key")) == [
        k for k in t.find_resources("AWS::KMS::Key") if k.startswith("JobLogsKey")]
    assert _resolved_env(stack, _guard_function(t)).topic_arn == arn


@pytest.mark.parametrize("profile", ["neuron-training", "neuron-inference"])
def test_neuron_clusters_get_a_guard_on_their_busiest_neuroncore_and_no_warning(profile):
    app = cdk.App()
    stack = TrainingStack.for_settings(app, from_context({"profile": profile}), quiet=True)
    t = Template.from_stack(stack)
    settings = _resolved_env(stack, _guard_function(t))
    assert settings.neuron_types and set(settings.neuron_types) == set(settings.expected_gpus)
    assert set(settings.expected_gpus.values()) == {1}, "one series per node: its busiest NeuronCore"
    warnings = [m for m in app.synth().get_stack_by_name(stack.stack_name).messages
                if "idle guard is off" in str(m.entry.data)]
    assert not warnings


def test_every_node_type_runs_the_agent_and_the_monitor(multi_node, monkeypatch, tmp_path):
    """The synthesized node settings: dl-monitor.service among the units, the catalog's GPU count,
    and the cluster from which the node writes the agent's configuration (its Job dimension)."""
    from constructs_lib.runtime.contract import parse_env
    from constructs_lib.runtime.cwagent_config import write_for_node

    stack, _ = multi_node
    for t in stack.cluster.templates:
        env = parse_env(t.node_env())
        assert "dl-monitor.service" in env["DL_UNITS"].split()
        assert env["DL_EXPECTED_GPUS"] == str(t.facts.accelerator_count) == str(H200_GPUS)
        for k in ("DL_CLUSTER", "DL_SDK"):
            monkeypatch.setenv(k, env[k])
        config = json.loads(write_for_node(str(tmp_path / "cw.json")))
        assert config["metrics"]["metrics_collected"]["nvidia_gpu"]["append_dimensions"] == {"Job": stack.cluster.cluster}
        assert t.user_data_bytes() <= 16 * 1024
        # The name as written, not a Ref token (which the user-data size check counts at 256 bytes).
        assert env["DL_CWAGENT_PARAMETER"] == "/dl-launcher/dl-multi-node-training/cloudwatch-agent"


def test_the_stack_carries_the_agent_configuration_and_only_its_nodes_read_it(multi_node):
    from constructs_lib.runtime.cwagent_config import agent_config

    stack, t = multi_node
    ((param_id, param),) = t.find_resources("AWS::SSM::Parameter").items()
    p = param["Properties"]
    assert p["Name"] == "/dl-launcher/dl-multi-node-training/cloudwatch-agent" and p["Type"] == "String"
    # With the job log (an interactive cluster has one: the guard warns there, the supervisor logs there).
    assert json.loads(p["Value"]) == agent_config(job="dl-multi-node-training",
                                                  log_group="/dl-launcher/dl-multi-node-training/job")
    assert len(p["Value"]) <= 4096  # the Standard tier's limit
    reads = [st for pol in t.find_resources("AWS::IAM::Policy").values()
             for st in pol["Properties"]["PolicyDocument"]["Statement"]
             if "ssm:GetParameter" in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])]
    assert reads and all(json.dumps({"Ref": param_id}) in json.dumps(st["Resource"]) for st in reads)


@pytest.mark.parametrize("profile, command, minutes, threshold, warning, interactive", [
    ("multi-node-training", "dl-torchrun train.py", 30, 5.0, 0, False),
    ("dev-prototyping", None, 60, 5.0, 15, True),   # no command: an interactive cluster, sessions count as work
    ("inference", "python serve.py", 60, 2.0, 15, False),  # a server's idle GPUs sit near 0%; traffic comes in bursts
])
def test_each_workload_gets_thresholds_that_fit_it(profile, command, minutes, threshold, warning, interactive):
    obs = from_context({"profile": profile, **({"command": command} if command else {})}).observability
    assert (obs.enabled, obs.idle_guard, obs.idle_minutes, obs.idle_threshold, obs.idle_warning, obs.interactive) == (
        True, True, minutes, threshold, warning, interactive)
    assert from_context({"profile": profile, "idle_minutes": "45"}).observability.idle_minutes == 45, "the key wins"
