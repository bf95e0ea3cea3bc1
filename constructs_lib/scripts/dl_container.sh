#!/bin/bash
# The job's command inside its container image (runtime/container.py docker_run): dl-torchrun on
# PATH as on the host (the node's bundle is mounted read-only at its own path), the job's secrets
# read from the file the supervisor wrote (then removed: they live in the command's environment
# only, never in the container's config), then the command.
LIB=${DL_LIB_DIR:-/usr/local/lib/dl-launcher}
if [ -n "${2:-}" ]; then
  set -a
  # shellcheck disable=SC1090  # written by the supervisor: export NAME='value' lines
  . "$2" || exit 1
  set +a
  rm -f "$2"
fi
bin=$(mktemp -d)
ln -s "$LIB/dl_torchrun.sh" "$bin/dl-torchrun"
export PATH="$bin:$PATH"
exec /bin/bash "$1"
