#!/bin/bash
# The job's command inside its container image (runtime/jobdef.py docker_run): dl-torchrun on
# PATH as on the host (the node's bundle is mounted read-only at its own path), then the command.
LIB=${DL_LIB_DIR:-/usr/local/lib/dl-launcher}
bin=$(mktemp -d)
ln -s "$LIB/dl_torchrun.sh" "$bin/dl-torchrun"
export PATH="$bin:$PATH"
exec /bin/bash "$1"
