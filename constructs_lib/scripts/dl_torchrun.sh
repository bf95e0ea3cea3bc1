#!/usr/bin/env bash
# torchrun with this cluster's rendezvous filled in: dl-torchrun train.py [args...]
# Ranks are derived again on every start, so a node that replaced a reclaimed one fits in.
set -euo pipefail
LIB=${DL_LIB:-/usr/local/lib/dl-launcher}
. "$LIB/dl_env.sh"
dl_load_env
/bin/bash "$LIB/dl_runtime.sh" rendezvous --nproc-per-node "${DL_PROCS_PER_NODE:-1}"
dl_load_env
torchrun=torchrun
for candidate in /opt/pytorch/bin/torchrun /opt/conda/bin/torchrun; do
  if [ -x "$candidate" ]; then torchrun=$candidate; break; fi
done
exec "$torchrun" --nnodes="$NNODES" --nproc-per-node="$NPROC_PER_NODE" --rdzv-backend=c10d \
  --rdzv-endpoint="$DL_RDZV_ENDPOINT" --rdzv-id="$DL_RDZV_ID" --max-restarts=3 "$@"
