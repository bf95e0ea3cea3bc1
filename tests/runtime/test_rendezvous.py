"""Rendezvous against moto's EC2: instances with tags and private IPs, no real cluster."""
from __future__ import annotations

import ipaddress

import boto3
import pytest

from constructs_lib.runtime.errors import RuntimeUserError
from constructs_lib.runtime.rendezvous import TAG_CLUSTER, cluster_members, discover, write


def launch(ec2, subnet, cluster: str, n: int) -> list[dict]:
    r = ec2.run_instances(ImageId="ami-12c6146b", MinCount=n, MaxCount=n, InstanceType="p4d.24xlarge", SubnetId=subnet,
                          TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": cluster}]}])
    return r["Instances"]


@pytest.fixture
def ec2(aws):
    client = boto3.client("ec2", region_name="us-east-1")
    vpc = client.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = client.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20")["Subnet"]["SubnetId"]
    return client, subnet


def test_every_node_derives_the_same_ranks(ec2):
    client, subnet = ec2
    nodes = launch(client, subnet, "job-a", 4)
    launch(client, subnet, "someone-else", 2)  # other clusters never join
    ips = [i["PrivateIpAddress"] for i in nodes]
    results = [discover(client, "job-a", ip, 4, 8, sleep=lambda s: None, log=lambda m: None) for ip in ips]
    assert len({r.hosts for r in results}) == 1, "one hostfile for all"
    assert sorted(r.node_rank for r in results) == [0, 1, 2, 3]
    r0 = next(r for r in results if r.node_rank == 0)
    assert r0.master_addr == min(ips, key=ipaddress.ip_address)
    env = r0.env()
    assert (env["NNODES"], env["NPROC_PER_NODE"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("4", "8", "32", "29500")
    assert env["DL_RDZV_ENDPOINT"] == f"{r0.master_addr}:29500"


def test_a_replaced_spot_node_rejoins_and_ranks_are_rederived(ec2):
    client, subnet = ec2
    nodes = launch(client, subnet, "job-b", 3)
    before = discover(client, "job-b", nodes[0]["PrivateIpAddress"], 3, 8, sleep=lambda s: None, log=lambda m: None)
    gone = nodes[1]
    client.terminate_instances(InstanceIds=[gone["InstanceId"]])
    polls = []
    survivor = nodes[0]["PrivateIpAddress"]

    def sleep(_):  # while the survivors wait, the Auto Scaling group launches the replacement
        polls.append(1)
        if len(polls) == 2:
            launch(client, subnet, "job-b", 1)

    after = discover(client, "job-b", survivor, 3, 8, poll=0, sleep=sleep, log=lambda m: None)
    assert len(polls) == 2, "waited for the replacement"
    assert gone["PrivateIpAddress"] not in after.hosts and len(after.hosts) == 3
    assert after.hosts != before.hosts


def test_rendezvous_times_out_with_one_clear_line(ec2):
    client, subnet = ec2
    (node,) = launch(client, subnet, "job-c", 1)
    with pytest.raises(RuntimeUserError, match="rendezvous: 1 of 2 nodes of cluster 'job-c' are up"):
        discover(client, "job-c", node["PrivateIpAddress"], 2, 8, timeout=0, sleep=lambda s: None, log=lambda m: None)


def test_a_spare_waits_until_a_place_is_free(ec2):
    client, subnet = ec2
    launch(client, subnet, "job-d", 3)
    members = cluster_members(client, "job-d")
    spare = members[-1]
    with pytest.raises(RuntimeUserError):
        discover(client, "job-d", spare, 2, 8, timeout=0, sleep=lambda s: None, log=lambda m: None)


def test_env_and_hostfile_files(tmp_path, ec2):
    client, subnet = ec2
    nodes = launch(client, subnet, "job-e", 2)
    r = discover(client, "job-e", nodes[0]["PrivateIpAddress"], 2, 4, sleep=lambda s: None, log=lambda m: None)
    write(r, str(tmp_path / "rendezvous.env"), str(tmp_path / "hostfile"))
    assert f'MASTER_ADDR="{r.master_addr}"' in (tmp_path / "rendezvous.env").read_text()
    assert (tmp_path / "hostfile").read_text().splitlines() == [f"{h} slots=4" for h in r.hosts]
