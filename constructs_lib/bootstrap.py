"""What a node does at boot: write its settings (node.env and each unit's file), fetch the node
bundle and start the units it needs. The user data that does it is rendered at synth and
checked there against EC2's 16 KB limit."""
from __future__ import annotations

from typing import Optional, Sequence

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
import jsii
from constructs import Construct, IValidation

from .bundle import AGENT_UNIT, JOB_UNIT, LOGS_UNIT, MONITOR_UNIT, UNITS, NodeBundle
from .facts import InstanceLike, resolve
from .runtime import contract
from .userdata import SettingsFile, limit_problem, upper_bound, user_data_parts


@jsii.implements(IValidation)
class _UserDataLimit:
    def __init__(self, owner: "NodeBootstrap") -> None:
        self.owner = owner

    def validate(self) -> list[str]:
        problem = limit_problem(self.owner.user_data_parts())
        return [problem] if problem else []


@jsii.implements(cdk.IStableStringProducer)
class _UserDataProducer:
    def __init__(self, owner: "NodeBootstrap") -> None:
        self.owner = owner

    def produce(self) -> str:
        return self.owner.user_data_script()


class NodeBootstrap(Construct):
    """The user data of one node type: a small bootstrap (constructs_lib/userdata.py) that writes
    this node's settings, fetches the node bundle from S3 and installs its units. A node that
    cannot fetch the bundle shuts itself down.

    Keyword-only props (defaults in brackets):
      instance: type name or InstanceFacts; its facts go into node.env.
      role: the node role; it is granted s3:GetObject on the bundle's object and nothing else.
      scratch_mount ["/scratch"]: the node's scratch space, checkpoints under it.
      extra_user_data [()]: bash lines run after the bootstrap (not if it fails: the node then
        shuts down). Tokens are fine.

    Attributes: facts, bundle (NodeBundle), user_data (ec2.UserData, rendered at synth so that
    what is enabled later still gets in).
    """

    def __init__(self, scope: Construct, construct_id: str, *, instance: InstanceLike, role: iam.IRole,
                 scratch_mount: str = "/scratch", extra_user_data: Sequence[str] = ()) -> None:
        super().__init__(scope, construct_id)
        self.facts = facts = resolve(instance)
        self.bundle = NodeBundle.of(self)
        self.bundle.grant_fetch(role)
        self._env: dict[str, str] = {}
        self.set_env(DL_INSTANCE_TYPE=facts.instance_type, DL_ACCELERATOR=facts.accelerator,
                     DL_PROCS_PER_NODE=str(facts.processes_per_node), DL_SDK=facts.sdk, DL_SCRATCH=scratch_mount,
                     DL_CHECKPOINT_DIR=f"{scratch_mount}/checkpoints", **contract.IMDS_PATIENCE)
        self._units: set[str] = set()
        self._files: list[SettingsFile] = []
        self._job: Optional[SettingsFile] = None
        self._extra = list(extra_user_data)
        self._agent_parameter: Optional[str] = None
        self.log_group: Optional[str] = None
        self.user_data = ec2.UserData.custom(cdk.Lazy.string(_UserDataProducer(self)))
        self.node.add_validation(_UserDataLimit(self))

    def set_env(self, **values: str) -> None:
        """Settings in node.env, read by the units and login shells. A token (e.g. a parameter's
        value) is checked by its key only: hold its value to a pattern without quotes, $ or
        backslashes (an AllowedPattern), as CloudFormation fills it in after this check."""
        contract.env_text({k: ("" if cdk.Token.is_unresolved(v) else v) for k, v in values.items()})
        self._env.update(values)

    def add_unit(self, unit: str, settings: Optional[SettingsFile] = None) -> None:
        """Start `unit` (one of bundle.UNITS) at boot, with the settings file it reads."""
        self._units.add(unit)
        if settings is not None:
            self._files.append(settings)

    def add_user_data(self, *lines: str) -> None:
        """Append bash lines, run after the bootstrap (tokens are fine)."""
        self._extra.extend(lines)

    def enable_checkpoints(self) -> None:
        """Start the node agent: it uploads new complete saves to the bucket and prefix named in
        the node's tags (at once on a spot notice)."""
        self.add_unit(AGENT_UNIT)

    def enable_job(self, *, cluster: str, command: str = "") -> None:
        """Start the job unit for `cluster`, running `command` (a bash script body, written
        verbatim; only the heredoc marker userdata.HEREDOC is refused)."""
        job = SettingsFile("the job command", "$DL_JOB_COMMAND_FILE", command) if command else None
        self._set_cluster(cluster, "enable_job")
        self._job = job
        self.add_unit(JOB_UNIT)

    def enable_job_definition(self, values: dict[str, str]) -> None:
        """node.env's pointer to the job's definition (JobDefinition.node_env()): the supervisor
        prepares and runs that instead of a command written here."""
        if self._job is not None:
            raise ValueError("enable_job_definition: this node already has a command written at boot; "
                             "give the command to the JobDefinition instead")
        self.set_env(**values)

    def enable_logs(self, *, log_group: str) -> None:
        """The job's log file to `log_group` through the CloudWatch agent (one stream per node):
        the monitor unit's agent when monitoring is on, else a unit of its own (dl-logs)."""
        self.log_group = log_group
        self.set_env(DL_LOG_GROUP=log_group)
        self.add_unit(LOGS_UNIT)

    def units(self) -> list[str]:
        """The units this node starts, in order. The monitor unit starts the agent itself."""
        units = [u for u in UNITS if u in self._units]
        if MONITOR_UNIT in units and LOGS_UNIT in units:
            units.remove(LOGS_UNIT)
        return units

    def enable_monitoring(self, *, job: str, agent_parameter: Optional[str] = None) -> None:
        """The CloudWatch agent (GPU, CPU, memory, scratch reads; agent_config.py) and the node
        monitor (throughput, progress, GPU health: runtime/monitor.py) under dl-monitor.service.
        `job` is the metrics' Job dimension (the cluster id). NVIDIA nodes also count their GPUs
        against the catalog's and watch for hardware XIDs."""
        gpu = self.facts.sdk == "cuda"
        # The monitor and the agent's config take the Job dimension from DL_CLUSTER: the same id
        # the job unit uses, so a node's metrics and its job can never disagree.
        self._set_cluster(job, "enable_monitoring")
        self.set_env(DL_EXPECTED_GPUS=str(self.facts.accelerator_count if gpu else 0))
        if agent_parameter:  # a token until deploy: node_env() adds it after env_text
            self._agent_parameter = agent_parameter
        self.add_unit(MONITOR_UNIT)  # dl_cwagent.sh: the parameter's config, or one written from node.env

    def _set_cluster(self, cluster: str, caller: str) -> None:
        current = self._env.get("DL_CLUSTER")
        if current is not None and current != cluster:
            raise ValueError(f"{caller}: cluster {cluster!r}, but this node's is already {current!r} "
                             "(the job and its metrics must name the same cluster)")
        self.set_env(DL_CLUSTER=cluster)

    def node_env(self) -> str:
        """node.env: this node's facts, its units and where its bundle is (tokens until deploy)."""
        units = " ".join(self.units())
        # Tokens cannot go through env_text (their ${Token[..]} markers hold a $); what
        # CloudFormation puts in their place, a bucket name and key and a region, holds no
        # quote, $ or backslash.
        parameter = self._agent_parameter
        plain = {k: v for k, v in self._env.items() if not cdk.Token.is_unresolved(v)}
        tokens = "".join(f'{k}="{v}"\n' for k, v in self._env.items() if k not in plain)
        return (contract.env_text({**plain, "DL_UNITS": units}) + tokens
                + f'DL_BUNDLE_URL="{self.bundle.url}"\nDL_REGION="{cdk.Stack.of(self).region}"\n'
                + (f'DL_CWAGENT_PARAMETER="{parameter}"\n' if parameter else ""))

    def user_data_parts(self) -> list[tuple[str, str]]:
        """(label, text) of each part of the user data, in order (for the size check)."""
        files = [SettingsFile("node settings (node.env)", "$DL_NODE_ENV_FILE", self.node_env()), *self._files]
        if self._job:
            files.append(self._job)
        return user_data_parts(files, self._extra)

    def user_data_script(self) -> str:
        """The user data as it will be deployed, with tokens where CloudFormation fills them in."""
        return "".join(text for _, text in self.user_data_parts())

    def user_data_bytes(self) -> int:
        """Its size, exact for text and at most userdata.TOKEN_BYTES for each token."""
        return upper_bound(self.user_data_script())
