# Sourced by the node's scripts: the contract's names, then the node's settings, as environment.
# shellcheck shell=bash
dl_load_env() {
  local lib=${DL_LIB_DIR:-/usr/local/lib/dl-launcher} f
  # shellcheck source=/dev/null  # generated into the bundle from constructs_lib/runtime/contract.py
  . "$lib/contract.sh"
  for f in "$DL_NODE_ENV_FILE" "$DL_EFA_ENV_FILE" "$DL_RENDEZVOUS_ENV_FILE" "$DL_RESUME_ENV_FILE"; do
    # shellcheck disable=SC1090  # env files written at synth, boot or by the supervisor
    if [ -f "$f" ]; then set -a; . "$f"; set +a; fi
  done
}
