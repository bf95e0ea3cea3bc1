"""The node contract: every name shared by the constructs (which write it at synth), the node
runtime (which reads it on the node) and the node's shell scripts (which source `contract.sh`,
generated from this module by `shell()`). A name changes here and nowhere else.

Standard library only: this module ships to the node with the runtime.

Directories can be moved with environment variables (DL_ETC_DIR, DL_RUN_DIR, DL_LIB_DIR,
DL_SCRATCH), so that tests run several nodes on one machine; every path below is derived from
them at call time, never cached.
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Optional

# ---- instance tags (readable on the node through IMDS: the launch templates enable it) ------------
TAG_CLUSTER = "dl-launcher:cluster"
TAG_NODES = "dl-launcher:nodes"
TAG_CHECKPOINT_BUCKET = "dl-launcher:checkpoint-bucket"
TAG_CHECKPOINT_PREFIX = "dl-launcher:checkpoint-prefix"
# The stack's own id (AWS::StackId: its name and a UUID), on every node beside the cluster name a
# user chose: the controller, the idle guard and the node role act only on instances carrying
# their own stack's id, so two stacks given the same job name never touch each other's nodes.
TAG_STACK = "dl-launcher:stack"

# A node sets this on itself when its GPUs are broken (a GPU missing, a hardware XID): "replace: <why>".
# The capacity controller terminates a node carrying it and launches its replacement.
TAG_HEALTH = "dl-launcher:health"
HEALTH_REPLACE = "replace"

# ---- the boot health gate (health_gate.py): node.env names the constructs write at synth ---------
# -c health_check=LEVEL picks how deep DCGM's diagnostic goes before a node joins its first
# generation (dcgmi diag -r 1|2|3: seconds, about 2 minutes, about 15 minutes by NVIDIA's docs).
ENV_HEALTH_CHECK = "DL_HEALTH_CHECK"
HEALTH_CHECKS = {"quick": 1, "standard": 2, "thorough": 3}  # level -> `dcgmi diag -r` suite
HEALTH_CHECK_DEFAULT = "quick"  # time to first step: level 1 runs in parallel with staging, in seconds
ENV_EXPECTED_EFA = "DL_EXPECTED_EFA"            # EFA devices the launch template attaches (0: none)
ENV_EXPECTED_SCRATCH_GB = "DL_EXPECTED_SCRATCH_GB"  # the instance-store NVMe the RAID spans, GB (0: no RAID)
ENV_INFINIBAND_DIR, INFINIBAND_DIR_DEFAULT = "DL_INFINIBAND_DIR", "/sys/class/infiniband"  # unset but in drills
ENV_EFA_BIN, EFA_BIN_DEFAULT = "DL_EFA_BIN", "/opt/amazon/efa/bin"  # the EFA installer's fi_info, fi_pingpong
# While training (stall.py): no step reported on a node for this long is a hang (-c hang_timeout=),
# and a run's first step (compile, restore, data loading) gets FIRST_STEP (-c first_step_timeout=).
ENV_HANG_SECONDS, HANG_SECONDS_DEFAULT = "DL_HANG_SECONDS", 300
ENV_FIRST_STEP_SECONDS, FIRST_STEP_SECONDS_DEFAULT = "DL_FIRST_STEP_SECONDS", 1800
# -c restart=in-process (ranks.py, inprocess.py): the supervisor runs the ranks, survivors keep their processes.
ENV_RESTART, RESTART_IN_PROCESS, RESTARTS = "DL_JOB_RESTART", "in-process", ("torchrun", "in-process")
STEPS_DIR = "steps"  # DL_RUN_DIR/steps/rank-<LOCAL_RANK>.json: each local rank's last step (steps.py)
HUNG_PREFIX = "hung: "  # how a hang's detail starts in a failure record (stall.py; `dl-launcher status` finds it)

# ---- the pre-generation all-reduce (collective_check.py): node.env names written at synth ----------
# -c collective_check=SIZE|off: the all-reduce every new generation's members run before the command.
ENV_COLLECTIVE_CHECK = "DL_COLLECTIVE_CHECK"        # MiB per rank, or "off"
COLLECTIVE_CHECKS = {"off": 0, "16MiB": 16, "64MiB": 64, "256MiB": 256, "1GiB": 1024}
COLLECTIVE_CHECK_DEFAULT = "256MiB"
ENV_ALLREDUCE_BASELINE = "DL_ALLREDUCE_BASELINE"    # "nodes:GB/s,..." for this node's type (the selector's data)
ENV_INSTANCE_TYPE = "DL_INSTANCE_TYPE"
# Test hook: seconds this node sleeps before each all-reduce of the check (a slow node, in drills).
ENV_ALLREDUCE_TEST_DELAY = "DL_TEST_ALLREDUCE_DELAY_SECONDS"

# ---- resource tags beyond the nodes -----------------------------------------------------------------
# What a dl-launcher Lambda function is (the budget stopper finds a product's controllers by it),
# and which portfolio product (portfolio/profile) a resource belongs to: the product's budget filters on it.
TAG_FUNCTION = "dl-launcher:function"
FUNCTION_CONTROLLER = "capacity-controller"
TAG_PRODUCT = "dl-launcher:product"
# On every taggable resource of a training stack (instances and volumes through the launch
# templates): the job's name, for Cost Explorer and for the stack's budget (-c budget=). cdk deploy
# also sets it on the stack itself, unless the deployer passes --tags (which then replace it).
TAG_JOB = "dl-launcher:job"
# A job's name: it names its stack (dl-NAME), checkpoint prefix and Service Catalog parameter.
JOB_NAME = r"[a-z0-9][a-z0-9-]{0,39}"
# The training stack's output naming its job: how the dl-launcher CLI knows a stack dl-JOB is one it
# made (its name alone says nothing: `dl-data-lake` may be anyone's). An output, because it is part
# of the template whoever deploys it; stacks deployed before it existed carry TAG_JOB instead.
OUTPUT_JOB = "DlLauncherJob"
# A Service Catalog product's own mark (its value: TAG_PRODUCT's, PORTFOLIO/PROFILE): with the job
# output and Service Catalog's AutoTags on the stack, it makes a provisioned product's stack a
# job's for the CLI (dl_launcher/jobstack.py; docs/security.md says who can write each).
OUTPUT_PRODUCT = "DlLauncherProduct"
# What the stack says its cluster id (TAG_CLUSTER's value) and its capacity controller's state key
# are: the CLI reads them rather than guess from the stack's name (a renamed stack, a product).
OUTPUT_CLUSTER = "DlLauncherCluster"
OUTPUT_STATE_KEY = "DlLauncherStateKey"

# ---- metrics (CloudWatch) -------------------------------------------------------------------------
# Every metric of both namespaces carries DIM_JOB (the cluster id, as in TAG_CLUSTER) and
# DIM_INSTANCE (the node); the agent's per-GPU metrics also its own DIM_GPU.
NS_NODE = "dl-launcher/Node"   # the CloudWatch agent: GPUs, CPU, memory, the scratch array's reads
NS_JOB = "dl-launcher/Job"     # the node runtime's monitor: throughput, progress, GPU health
DIM_JOB = "Job"
DIM_INSTANCE = "InstanceId"
DIM_GPU = "index"              # the agent's own dimension name on nvidia_gpu metrics
# The agent's names (its nvidia_gpu, cpu, mem and diskio plugins with their default prefixes).
M_GPU_UTIL = "nvidia_smi_utilization_gpu"       # percent
M_GPU_MEMORY = "nvidia_smi_memory_used"         # MiB
M_GPU_POWER = "nvidia_smi_power_draw"           # W
M_GPU_TEMPERATURE = "nvidia_smi_temperature_gpu"  # deg C
M_CPU_ACTIVE = "cpu_usage_active"               # percent, all cores together
M_CPU_IOWAIT = "cpu_usage_iowait"               # percent
M_MEMORY = "mem_used_percent"
M_DISK_READ = "diskio_read_bytes"               # bytes per collection interval, the scratch device
# The monitor's (one value a minute per node).
M_SAMPLES = "SamplesPerSecond"   # mean of the dl-bench lines the job printed on this node that minute
M_TRAINING = "TrainingRunning"   # 1 while the training command runs on this node, else 0
M_RESTORING = "Restoring"        # 1 while the supervisor restores a checkpoint or stages data, else 0
M_GPUS = "GpusVisible"           # GPUs the driver lists (compare with the catalog's count)
M_XID = "XidErrors"              # hardware XID errors the kernel logged this minute
# Trainium/Inferentia: the busiest NeuronCore that minute (neuron-monitor; runtime/neuron.py), percent,
# one series per node: what the idle guard reads there instead of the agent's NVIDIA utilisation.
M_NEURON_UTIL = "NeuronCoreUtilization"
# What an interactive cluster's idle guard counts as someone at work (fleet/idle_guard.py):
M_SESSIONS = "OpenSessions"      # Session Manager sessions open on this node (shells and port forwards)
M_GPU_PROCESSES = "GpuProcesses"  # processes holding a CUDA context on this node's GPUs
M_CAPACITY_SHORT = "CapacityShortRuns"  # the controller's runs that found the cluster short (alarms.py)
METRIC_PERIOD = 60               # seconds: the agent's interval and the monitor's

# ---- the rendezvous ----------------------------------------------------------------------------
# Generation g of a cluster uses port BASE + g % SPAN: a straggling worker of an old generation
# can never join a new one, and a restarted master never waits for its old socket to close.
RENDEZVOUS_PORT_BASE = 29500
RENDEZVOUS_PORT_SPAN = 400


def rendezvous_port_base() -> int:
    """DL_RENDEZVOUS_PORT_BASE (the same on every node: node.env) moves the range where something
    else on the image holds it; drills sharing one machine give each cluster its own range,
    since torch's store listens on every address."""
    return int(os.environ.get("DL_RENDEZVOUS_PORT_BASE") or RENDEZVOUS_PORT_BASE)


# Cluster state lives beside the checkpoints, under <checkpoint prefix>/CLUSTER_DIR/ (the nodes
# write it). The capacity controller's (which type, when a node was lost, every transition, its
# lease) lives outside every job's prefix, under CONTROL_DIR, which the bucket policy denies the
# nodes: no process on a node can hold the lease or forge the controller's memory.
CLUSTER_DIR = "_cluster"
CONTROL_DIR = "_control"
# <prefix>/CLUSTER_DIR/GONE_DIR/<node>.json: a member EC2 says is gone, written by the node that
# asked EC2 (liveness) or by the capacity controller from EC2's state-change event; every node lists it.
GONE_DIR = "gone"


def capacity_state_key(cluster: str) -> str:
    return f"{CONTROL_DIR}/{cluster}/capacity-state.json"


def guard_state_key(cluster: str) -> str:
    """The idle guard's last judgement and pending warning (dl-launcher status reads it)."""
    return f"{CONTROL_DIR}/{cluster}/idle-guard.json"


GUARD_LOG_STREAM = "idle-guard"  # the guard's notices in the job's log group, beside the nodes' streams


# ---- directories ----------------------------------------------------------------------------------
DIR_DEFAULTS = {
    "DL_ETC_DIR": "/etc/dl-launcher",          # settings written at synth or boot
    "DL_RUN_DIR": "/run/dl-launcher",          # state of this boot (tmpfs: gone at reboot)
    "DL_LIB_DIR": "/usr/local/lib/dl-launcher",  # the runtime bundle (scripts, Python, units)
    "DL_SCRATCH": "/scratch",                  # instance-store RAID 0 (or the root volume)
    "DL_LOG_DIR": "/var/log/dl-launcher",      # the job's log file, which the CloudWatch agent ships
}


def _dir(var: str) -> str:
    return os.environ.get(var) or DIR_DEFAULTS[var]


def etc_dir() -> str:
    return _dir("DL_ETC_DIR")


def run_dir() -> str:
    return _dir("DL_RUN_DIR")


def lib_dir() -> str:
    return _dir("DL_LIB_DIR")


def scratch_dir() -> str:
    return _dir("DL_SCRATCH")


def log_dir() -> str:
    return _dir("DL_LOG_DIR")


def data_dir() -> str:
    """Where -c data=s3://BUCKET/PREFIX is staged: data_dir()/BUCKET/PREFIX, a mirror of the prefix
    on the scratch RAID (what the job writes there is removed at the next staging). The job sees
    it as DL_DATA_DIR."""
    return os.environ.get("DL_DATA_DIR") or os.path.join(scratch_dir(), "data")


# An S3 bucket name's shape (3-63 of a-z 0-9 . -, a letter or digit at each end): the store's
# --bucket and the job's data prefixes are checked against it.
S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z", re.ASCII)

# The transfer tool's configuration while it stages data (Python only: not in contract.sh, whose
# every byte counts against EC2's 16 KB of user data).
STAGING_CONFIG = "staging-aws.config"


def code_dir() -> str:
    """Where each code revision is unpacked, one directory per tree digest (scratch: rebuilt every boot)."""
    return os.path.join(scratch_dir(), "code")


def work_dir() -> str:
    """The job's working directory: a link to the code of the generation that runs now (or, with
    no code, an empty directory of its own)."""
    return os.path.join(scratch_dir(), "work")


# ---- files ----------------------------------------------------------------------------------------
# (directory variable, file name): the shell scripts get each as DL_<NAME>_FILE in contract.sh.
FILES = {
    "node_env": ("DL_ETC_DIR", "node.env"),          # facts of this node and its job (synth)
    "efa_env": ("DL_ETC_DIR", "efa.env"),            # NCCL/libfabric settings (boot)
    "job_command": ("DL_ETC_DIR", "job.sh"),         # the deployer's command, verbatim
    "rendezvous_env": ("DL_RUN_DIR", "rendezvous.env"),  # this generation's MASTER_ADDR, NODE_RANK, ...
    "hostfile": ("DL_RUN_DIR", "hostfile"),
    "resume_env": ("DL_RUN_DIR", "resume.env"),      # DL_RESUME_FROM / DL_RESUME_STEP of this generation
    "notice": ("DL_RUN_DIR", "notice.json"),         # what the watcher saw (termination, rebalances)
    # One file per component (bootstrap, raid, restore, job...): "<level> <message>", level one of
    # HEALTH_LEVELS. Shell scripts write theirs with one echo; `status` reads them all.
    "health_dir": ("DL_RUN_DIR", "health.d"),
    "outcome_dir": ("DL_RUN_DIR", "outcome"),        # one file per training rank: finished | interrupted
    # Held by the agent while it uploads or prunes, and by the supervisor while it sets aside
    # saves the cluster did not continue from: nothing is deleted or moved under an upload.
    "upload_lock": ("DL_RUN_DIR", "upload.lock"),
    "pushed": ("DL_RUN_DIR", "pushed.json"),         # newest step this node has pushed to S3
    "supervisor_state": ("DL_RUN_DIR", "supervisor.json"),
    # What the supervisor is doing now, for the monitor: {"phase": PHASES[i], "pid": N, "since": t}.
    "phase": ("DL_RUN_DIR", "phase.json"),
    "cwagent_config": ("DL_RUN_DIR", "cloudwatch-agent.json"),  # the CloudWatch agent's config (boot)
    # The node monitor's memory across its restarts within a boot (hardware XID lines already counted).
    "monitor_state": ("DL_RUN_DIR", "monitor.json"),
    # The job's output, setup's and the supervisor's lines: one file, one log stream per node.
    "job_log": ("DL_LOG_DIR", "job.log"),
    # Job definitions fetched this boot (by their sha256), and setup runs done this boot (by key).
    "definitions_dir": ("DL_RUN_DIR", "definitions"),
    "setup_dir": ("DL_RUN_DIR", "setup.d"),
}
PHASES = ("staging", "restoring", "training", "between")


def path(name: str) -> str:
    var, base = FILES[name]
    return os.path.join(_dir(var), base)


def checkpoint_dir() -> str:
    return os.environ.get("DL_CHECKPOINT_DIR") or os.path.join(scratch_dir(), "checkpoints")


def memory_dir() -> str:
    """The memory tier's snapshots (memory_store.py): host memory, tmpfs. /dev/shm is half the
    RAM by default; /run (DL_RUN_DIR) is often a fifth, too small for a model's state."""
    return os.environ.get("DL_MEMORY_DIR") or "/dev/shm/dl-launcher"


HEALTH_LEVELS = ("ok", "degraded", "failed")

# ---- the job: its definition, code, environment and logs (jobdef.py, JobDefinition) ---------------
# Per cluster: the SSM parameter that names the job's current revision (written by CloudFormation
# only: a redeploy changes it, no node can), the CloudWatch agent's configuration, and the log
# group of the job's output (one stream per node, named by the agent's {instance_id}).


def job_parameter(cluster: str) -> str:
    return f"/dl-launcher/{cluster}/job"


def agent_parameter(cluster: str) -> str:
    return f"/dl-launcher/{cluster}/cloudwatch-agent"


def job_log_group(cluster: str) -> str:
    return f"/dl-launcher/{cluster}/job"


LOG_STREAM = "{instance_id}"
# What the runtime sets for every run: a deployer's env may not name these (or any DL_ name).
RESERVED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                "GROUP_RANK", "ROLE_RANK", "NNODES", "NPROC_PER_NODE", "PYTHONPATH", "PATH", "HOME")
RESERVED_ENV_PREFIXES = ("DL_", "TORCHELASTIC_")

# ---- exit codes: the job unit and the training command --------------------------------------------
# The training command: 0 = it ended normally; whether it finished or stopped for a termination
# notice is recorded by Checkpointer in outcome_dir. Anything else is a failure.
# The job supervisor (dl-job.service), for systemd:
# botocore asks IMDS for the instance role's credentials once, with a 1 s timeout: on a node busy
# at boot that is "no credentials", which stopped jobs for good. Every process on the node (units,
# the user's job) reads these from node.env.
IMDS_PATIENCE = {"AWS_METADATA_SERVICE_TIMEOUT": "2", "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "5"}

# What a training process gets, besides DL_NOTICE_FILE, on a termination notice or a rebalance
# recommendation: SIGUSR1 (SLURM's --signal convention, which Lightning and many scripts handle),
# sent only to processes that catch it, so a script that does not is never killed by it.
NOTICE_SIGNAL = "SIGUSR1"
# The job's secrets for its container, in the run directory (0600, removed once the container
# starts). Not in FILES: those are exported to every shell script, and no script needs this one.
CONTAINER_SECRETS = "container-secrets.env"

EXIT_FINISHED = 0    # the job is done on every node (or was done before this node came)
EXIT_USAGE = 2       # a setting is wrong: restarting cannot help
EXIT_FAILED = 3      # the training command failed repeatedly without progress: the job is stopped
NO_RESTART_EXITS = (EXIT_USAGE, EXIT_FAILED)  # RestartPreventExitStatus of the job unit

# ---- env files ------------------------------------------------------------------------------------
_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*\Z")
_UNSAFE = set('"\\$`\n\r\0')


def env_problem(key: str, value: str) -> Optional[str]:
    """Why key=value cannot go into an env file that systemd's EnvironmentFile= and bash's `.`
    both read the same way, or None."""
    if not _KEY.match(key):
        return f"env key {key!r}: use upper-case letters, digits and _"
    bad = sorted(_UNSAFE & set(value))
    if bad:
        return f"{key}: value {value!r} has {', '.join(repr(c) for c in bad)}, which env files cannot carry safely"
    return None


def env_text(values: Mapping[str, str]) -> str:
    """KEY="value" lines; raises ValueError for a key or value that would change meaning."""
    for k, v in values.items():
        problem = env_problem(k, str(v))
        if problem:
            raise ValueError(problem)
    return "".join(f'{k}="{v}"\n' for k, v in values.items())


def parse_env(text: str) -> dict[str, str]:
    """The reverse of env_text (comments and blank lines skipped; quotes optional)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
            v = v[1:-1]
        out[k.strip()] = v
    return out


def read_env(name: str) -> dict[str, str]:
    """An env file of the contract by name ({} if it does not exist)."""
    try:
        with open(path(name)) as f:
            return parse_env(f.read())
    except FileNotFoundError:
        return {}


def shell() -> str:
    """contract.sh: the same names for the node's shell scripts (sourced by dl_env.sh). Directory
    variables already set in the environment win, as they do here."""
    lines = ["# generated from constructs_lib/runtime/contract.py: do not edit", "# shellcheck shell=bash"]
    for var, default in DIR_DEFAULTS.items():
        lines.append(f'{var}="${{{var}:-{default}}}"')
        lines.append(f"export {var}")
    for name, (var, base) in FILES.items():
        suffix = "" if name.endswith(("_dir", "file", "_lock")) else "_FILE"
        lines.append(f'DL_{name.upper()}{suffix}="${{{var}}}/{base}"')
    lines.append('DL_CHECKPOINT_DIR="${DL_CHECKPOINT_DIR:-${DL_SCRATCH}/checkpoints}"')
    lines.append("export DL_CHECKPOINT_DIR")
    # A base set in the environment wins, as rendezvous_port_base() lets it: assigning over an
    # exported variable would change what the supervisor reads.
    lines.append(f'DL_RENDEZVOUS_PORT_BASE="${{DL_RENDEZVOUS_PORT_BASE:-{RENDEZVOUS_PORT_BASE}}}"')
    for const in ("TAG_CLUSTER", "TAG_NODES", "TAG_CHECKPOINT_BUCKET", "TAG_CHECKPOINT_PREFIX",
                  "RENDEZVOUS_PORT_SPAN", "EXIT_FINISHED", "EXIT_USAGE", "EXIT_FAILED"):
        lines.append(f'DL_{const}="{globals()[const]}"')
    return "\n".join(lines) + "\n"
