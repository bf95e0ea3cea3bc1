"""Another team's CDK app using dl-launcher's constructs (pip install dl-launcher).

    cdk synth --app "python examples/own_cdk_app.py"
"""
import aws_cdk as cdk
import aws_cdk.aws_autoscaling as autoscaling
import aws_cdk.aws_ec2 as ec2

from constructs_lib import GpuLaunchTemplate


class ResearchCluster(cdk.Stack):
    def __init__(self, scope, construct_id, **kwargs):
        super().__init__(scope, construct_id, **kwargs)
        # One AZ: a cluster placement group cannot span AZs. Private subnets: EFA nodes have
        # several interfaces and so cannot take a public IP; SSM needs only egress.
        vpc = ec2.Vpc(self, "Vpc", max_azs=1, nat_gateways=1)
        vpc.add_flow_log("FlowLog")

        node = GpuLaunchTemplate(
            self, "Node", vpc=vpc,
            instance_type="p5.48xlarge",   # or profile="multi-node-training"
            multi_node=True,               # EFA on all 32 cards + cluster placement group
            scratch_mount="/scratch",      # RAID 0 over the 8 local NVMe disks
        )
        node.add_user_data("echo 'node ready' > /etc/motd")

        # Any capacity that takes a launch template works; here a plain Auto Scaling group.
        asg = autoscaling.CfnAutoScalingGroup(
            self, "Nodes", min_size="0", max_size="4", desired_capacity="2",
            vpc_zone_identifier=vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnet_ids,
            launch_template=autoscaling.CfnAutoScalingGroup.LaunchTemplateSpecificationProperty(
                launch_template_id=node.launch_template.launch_template_id,
                version=node.launch_template.latest_version_number),
            placement_group=node.placement_group_name,
        )
        cdk.CfnOutput(self, "Asg", value=asg.ref)


if __name__ == "__main__":
    app = cdk.App()
    ResearchCluster(app, "ResearchCluster", env=cdk.Environment(region="us-east-1"))
    app.synth()
