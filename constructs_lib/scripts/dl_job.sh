#!/usr/bin/env bash
# The job unit's entry point: the supervisor agrees on each generation with the other nodes,
# restores the agreed checkpoint and runs the deployer's command (see `runtime/supervisor.py`
# for the exit-code contract that systemd's Restart= settings follow).
set -euo pipefail
LIB=${DL_LIB_DIR:-/usr/local/lib/dl-launcher}
. "$LIB/dl_env.sh"
dl_load_env
exec /bin/bash "$LIB/dl_runtime.sh" job
