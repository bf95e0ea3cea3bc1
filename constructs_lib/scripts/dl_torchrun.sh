#!/usr/bin/env bash
# torchrun with this generation's rendezvous: dl-torchrun train.py [args...]
# Static rendezvous: torch's node rank is the plan's rank (so MASTER_ADDR is where global rank 0
# runs and writes checkpoints), and --max-restarts=0: a restart is a new generation, agreed by
# every node through the supervisor, never torch's own restart with a stale master.
set -euo pipefail
LIB=${DL_LIB_DIR:-/usr/local/lib/dl-launcher}
. "$LIB/dl_env.sh"
dl_load_env
if [ -z "${MASTER_ADDR:-}" ] || [ -z "${NODE_RANK:-}" ]; then
  echo "dl-torchrun: no rendezvous in $DL_RENDEZVOUS_ENV_FILE: the job unit (dl-job.service) writes it" >&2
  exit 2
fi
torchrun=${DL_TORCHRUN:-}
if [ -z "$torchrun" ]; then
  torchrun=torchrun
  for candidate in /opt/pytorch/bin/torchrun /opt/conda/bin/torchrun; do
    if [ -x "$candidate" ]; then torchrun=$candidate; break; fi
  done
fi
# Every rank's lines carry its node and global rank ("[node1 rank9]:"), in the job's log as on the
# console: torchrun prefixes lines only when it tees them (its copies go under the scratch).
if [ -z "${TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE:-}" ]; then
  # shellcheck disable=SC2016  # ${rank} is torch's, filled in per rank
  export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[node${NODE_RANK} rank"'${rank}'"]: "
fi
exec "$torchrun" --nnodes="$NNODES" --node-rank="$NODE_RANK" --nproc-per-node="$NPROC_PER_NODE" \
  --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" --max-restarts=0 \
  --tee=3 --log-dir="${DL_SCRATCH:-/scratch}/torchrun-logs" "$@"
