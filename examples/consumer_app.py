"""A platform team's own CDK app built from dl-launcher's constructs: a two-node spot cluster with
checkpoints in S3, the user's job and its logs, the GPU dashboard and the idle guard, checked by
cdk-nag. The suite installs the wheel into a clean venv outside the repository and runs

    cdk synth --app "python consumer_app.py"

on the lowest and the pinned aws-cdk-lib of the supported range (tests/test_consumer.py).
"""
import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
from cdk_nag import AwsSolutionsChecks
from constructs import Construct

from constructs_lib import (CheckpointBucket, ClusterCapacity, ClusterObservability, InstanceOption,
                            InterruptionAlerts, JobDefinition, JobLogs)
from constructs_lib.runtime.contract import capacity_state_key


class TeamCluster(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        # One AZ: a cluster placement group cannot span AZs. The nodes sit in private subnets
        # (EFA nodes have several interfaces, so no public IP); SSM needs only egress.
        vpc = ec2.Vpc(self, "Vpc", max_azs=1, nat_gateways=1)
        vpc.add_flow_log("FlowLog")

        checkpoints = CheckpointBucket(self, "Checkpoints")
        alerts = InterruptionAlerts(self, "Alerts")
        cluster = ClusterCapacity(
            self, "Cluster", vpc=vpc, cluster="team-llm", nodes=2, market="spot",
            # An ec2.InstanceType or a plain name; the price is the most the team pays per node-hour.
            options=[InstanceOption(ec2.InstanceType("p5.48xlarge"), 40.0)],
            # The controller's lease lives outside the job's prefix, where no node may write.
            state_bucket=checkpoints.bucket, state_key=capacity_state_key("team-llm"),
            log_group=alerts.log_group)
        cluster.enable_checkpoints(checkpoints, "jobs/team-llm")
        job = JobDefinition(self, "Job", cluster="team-llm", command="torchrun train.py",
                            env={"HF_HOME": "/scratch/hf"})
        cluster.configure_job(definition=job, logs=JobLogs(self, "JobLogs", cluster="team-llm"))
        ClusterObservability(self, "Observability", capacity=cluster, log_group=alerts.log_group,
                             checkpoints=checkpoints.bucket, checkpoint_prefix="jobs/team-llm")


if __name__ == "__main__":
    app = cdk.App()
    TeamCluster(app, "TeamCluster", env=cdk.Environment(region="us-east-1"))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))  # every synth is checked
    app.synth()
