"""The job's secret values never reach a record in S3 (issue 35, item 6): a failed setup's or
command's last lines in failed.json, a failure's detail, a join's health. The records are read
back raw from moto_server, so what is checked is what S3 holds."""
from __future__ import annotations

import boto3

from constructs_lib.runtime import contract
from constructs_lib.runtime.redact import Redactor
from tests.runtime.test_bad_records import _supervisor

SECRET = "s3cr3t-Value-0123456789"


def test_secret_values_are_redacted_from_the_failure_record(store):
    from constructs_lib.runtime.jobdef import JobError, NodeJob

    said: list[str] = []
    sup = _supervisor(store, said.append)
    sup.job = NodeJob(log=said.append, client=lambda *a, **k: None)
    sup.cluster.redact = sup.job.redactor.scrub
    sup.job.redactor.add([SECRET, '{"user": "admin", "password": "pa55word-xyz"}', "-----BEGIN KEY-----\nAAAABBBBCCCC\n"])

    class Log:
        @staticmethod
        def last_lines():
            return [f"export TOKEN={SECRET}", f"cut at the limit: {SECRET[:9]}", "pw pa55word-xyz", "AAAABBBBCCCC"]
    sup.joblog = Log()
    err = JobError(f"setup exited 1 after 3 s; last lines: token={SECRET} | done", final=True)
    assert sup._job_error(err, 0) == contract.EXIT_FAILED
    sup.cluster.record_failure(1, "i-0a", f"exit 1 ({SECRET})")
    for rel in ("failed.json", "gen-000001/failed/i-0a.json"):
        raw = boto3.client("s3").get_object(Bucket=store.bucket,
                                            Key=f"{store.prefix}/{contract.CLUSTER_DIR}/{rel}")["Body"].read().decode()
        for leaked in (SECRET, SECRET[:9], "pa55word-xyz", "AAAABBBBCCCC"):
            assert leaked not in raw, (rel, raw)
        assert "[redacted]" in raw
    failed = sup.cluster.failed()
    assert failed["last_lines"][0] == "export TOKEN=[redacted]" and "setup exited 1" in failed["reason"]


def test_the_job_remembers_every_secret_value_it_reads(s3env):
    from constructs_lib.runtime.jobdef import Definition, NodeJob

    sm = boto3.client("secretsmanager", region_name="us-east-1")
    arn = sm.create_secret(Name="tok", SecretString=SECRET)["ARN"]
    boto3.client("ssm", region_name="us-east-1").put_parameter(Name="/job/pw", Value="param-value-42",
                                                             Type="SecureString")
    ssm_arn = "arn:aws:ssm:us-east-1:123456789012:parameter/job/pw"
    job = NodeJob(log=print, region="us-east-1", client=lambda service, **kw: boto3.client(service, **kw))
    d = Definition("0" * 64, "true", None, {}, {"TOKEN": arn, "PW": ssm_arn}, None, None)
    assert job.secrets(d) == {"TOKEN": SECRET, "PW": "param-value-42"}
    assert job.redactor.text(f"a {SECRET} b param-value-42") == "a [redacted] b [redacted]"


def test_short_values_and_plain_text_are_left_alone():
    r = Redactor()
    r.add(["abc", "", "longer-value"])
    assert r.text("abc is fine, longer-value is not") == "abc is fine, [redacted] is not"
    assert r.scrub({"k": ["longer-value", 3, None]}) == {"k": ["[redacted]", 3, None]}


def test_a_joins_health_is_redacted(store):
    from constructs_lib.runtime.cluster import Member
    from constructs_lib.runtime.jobdef import NodeJob

    sup = _supervisor(store, print)
    sup.job = NodeJob(log=print, client=lambda *a, **k: None)
    sup.cluster.redact = sup.job.redactor.scrub
    sup.job.redactor.add([SECRET])
    sup.cluster.join(1, Member("i-0a", "10.0.0.1"), health={"setup": f"failed setup exited 1; last lines: {SECRET}"})
    s3 = boto3.client("s3")
    [key] = [o["Key"] for o in s3.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix)["Contents"]]
    raw = s3.get_object(Bucket=store.bucket, Key=key)["Body"].read().decode()
    assert SECRET not in raw and "last lines: [redacted]" in raw
    assert sup.cluster.join_details(1)["i-0a"]["health"]["setup"].endswith("[redacted]")


def test_the_supervisor_wires_the_jobs_redactor_into_its_records(store):
    from constructs_lib.runtime.cluster import ClusterState, Liveness
    from constructs_lib.runtime.jobdef import NodeJob
    from constructs_lib.runtime.supervisor import Supervisor, SupervisorConfig

    job = NodeJob(log=print, client=lambda *a, **k: None)
    cluster = ClusterState(store)
    Supervisor(SupervisorConfig(cluster="c", nodes=1, nproc_per_node=1, node="i-0a", addr="10.0.0.1"), store, cluster,
               Liveness(None, cluster), job=job)
    job.redactor.add([SECRET])
    assert cluster.redact({"reason": SECRET}) == {"reason": "[redacted]"}
