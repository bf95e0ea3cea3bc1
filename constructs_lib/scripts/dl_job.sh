#!/usr/bin/env bash
# The job unit's entry point: resume from the newest complete checkpoint, then run DL_COMMAND
# (from /etc/dl-launcher/job.env) in the scratch directory. systemd restarts it on failure,
# e.g. after a peer node was reclaimed, and every restart resumes again.
set -euo pipefail
LIB=${DL_LIB:-/usr/local/lib/dl-launcher}
. "$LIB/dl_env.sh"
dl_load_env
if [ -z "${DL_COMMAND:-}" ]; then
  echo "dl-job: no command configured (cdk deploy -c command=...); the node stays up for SSM sessions"
  exit 0
fi
/bin/bash "$LIB/dl_runtime.sh" resume
dl_load_env
cd "${DL_SCRATCH:-/tmp}"
echo "dl-job: running: $DL_COMMAND"
exec /bin/bash -c "$DL_COMMAND"
