"""The benchmark stack (`cdk deploy -c bench=PLAN_FILE`): one short-lived instance per planned
candidate, each writing its result to the results bucket and terminating itself."""
from __future__ import annotations

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
from constructs import Construct

from constructs_lib import CheckpointBucket, NodeIdentity
from constructs_lib.bench_node import BenchNode, RunnerAsset
from constructs_lib.runtime.contract import TAG_CLUSTER

from .bench_settings import BenchSettings
from .network import existing_subnets, training_vpc

TAG_CANDIDATE = "dl-launcher:bench-candidate"
TAG_PLAN = "dl-launcher:bench-plan"


class BenchStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, settings: BenchSettings, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        plan = settings.plan
        if settings.subnet_ids:
            self.vpc, subnets = existing_subnets(self, vpc_id=settings.vpc_id, subnet_ids=settings.subnet_ids,
                                                 availability_zone=settings.availability_zone)
        else:
            self.vpc = training_vpc(self, vpc_id=None, restrict_default_security_group=not settings.local)
            subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        # Kept after cdk destroy, like checkpoints: results outlive the instances that made them.
        self.results = CheckpointBucket(self, "Results")
        self.identity = NodeIdentity(self, "Identity", vpc=self.vpc, label=f"benchmark {plan.name}")
        self.runner = RunnerAsset(self, "Runner")
        self.runner.grant_fetch(self.identity.role)
        prefix = plan.prefix
        # The runner writes; it never reads or lists (collect runs with the user's own credentials).
        iam.Grant.add_to_principal(grantee=self.identity.role, actions=["s3:PutObject"],
                                   resource_arns=[self.results.bucket.arn_for_objects(f"{prefix}/*")])
        cdk.Validations.of(self.identity.role).acknowledge(cdk.Acknowledgment(
            id=f"AwsSolutions-IAM5[Resource::<{self.get_logical_id(self.results.bucket.node.default_child)}.Arn>"
               f"/{prefix}/*]",
            reason="result objects are named by candidate type at run time; the wildcard is confined to this "
                   "plan's prefix, write only"))
        self.nodes = []
        for c, facts in zip(plan.candidates, settings.facts):
            node = BenchNode(
                self, f"Node-{c.instance_type.replace('.', '-')}", facts=facts, vpc=self.vpc, subnets=subnets,
                role=self.identity.role, instance_profile=self.identity.instance_profile,
                security_group=self.identity.security_group, results=self.results.bucket, prefix=prefix,
                runner=self.runner, minutes=plan.minutes, market=plan.market, command=plan.command,
                region=plan.region, max_price=c.max_price_per_hour if plan.market == "spot" else None,
                tags={TAG_CLUSTER: construct_id, TAG_PLAN: plan.name, TAG_CANDIDATE: c.instance_type,
                      "Name": f"{construct_id} {c.instance_type}"})
            self.nodes.append(node)
        bucket = self.results.bucket.bucket_name
        cdk.CfnOutput(self, "ResultsBucket", value=bucket, description=f"results under s3://<bucket>/{prefix}/; kept "
                                                                       "after cdk destroy")
        cdk.CfnOutput(self, "ResultsPrefix", value=prefix,
                      description="started/<type>.json when a node boots, results/<type>.json when it is done")
        cdk.CfnOutput(self, "CollectCommand", value=cdk.Fn.join("", [
            "python -m dl_selector bench collect --bucket ", bucket, f" --prefix {prefix} --plan {settings.plan_file}"]),
            description="run once every node has reported (at most the plan's minutes after the deploy)")
        pairs = [part for i, (c, n) in enumerate(zip(plan.candidates, self.nodes))
                 for part in (f"{' ' if i else ''}{c.instance_type}=", n.instance.ref)]
        cdk.CfnOutput(self, "Instances", value=cdk.Fn.join("", pairs),  # one level of Fn::Join: moto resolves no nesting
            description="type=instance-id; look in with: aws ssm start-session --target <id>; "
                        "console: aws ec2 get-console-output --latest --instance-id <id>")
        cdk.CfnOutput(self, "InstancesCommand", value=(
            f"aws ec2 describe-instances --region {plan.region} --filters Name=tag:{TAG_PLAN},Values={plan.name} "
            f"--query \"Reservations[].Instances[].[Tags[?Key=='{TAG_CANDIDATE}']|[0].Value,InstanceId,State.Name]\" "
            "--output text"), description="each candidate's instance and its state (terminated once done)")
        cdk.CfnOutput(self, "Candidates", value=",".join(c.instance_type for c in plan.candidates),
                      description=(f"{len(plan.candidates)} instance(s) on {plan.market}, each terminated after at most "
                                   f"{plan.minutes} min; at most ${plan.worst_total_cost_usd or plan.total_cost_usd:,.2f} "
                                   "in all at the prices on record")[:1000])


def bench_stack(app: cdk.App, settings: BenchSettings, *, synthesizer=None) -> BenchStack:
    plan = settings.plan
    print(f"dl-launcher bench {plan.name}: {len(plan.candidates)} x 1 instance on {plan.market} in {plan.region}, "
          f"at most {plan.minutes} min each, at most ${plan.worst_total_cost_usd or plan.total_cost_usd:,.2f} in all; "
          f"runs: {plan.command}", file=__import__("sys").stderr)
    print(f"dl-launcher bench {plan.name}: a candidate EC2 cannot launch (no spot capacity, a quota) fails the deploy "
          "and CloudFormation rolls the others back; `cdk deploy --no-rollback` keeps them running", file=__import__("sys").stderr)
    return BenchStack(app, f"dl-bench-{plan.name}", settings=settings, synthesizer=synthesizer,
                      env=cdk.Environment(region=plan.region),
                      description=f"dl-launcher benchmark {plan.name}: {', '.join(c.instance_type for c in plan.candidates)}"[:1024])
