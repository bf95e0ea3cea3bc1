#!/bin/bash
# Installs the node bundle this script came in (DL_LIB_DIR) and starts this node's units
# (DL_UNITS in node.env). Run by the bootstrap on first boot; running it again changes nothing.
# Every unit is installed and enabled before any is started, and each start is --no-block, so a
# unit that fails (RAID, EFA) never keeps the others, the job unit above all, from existing and
# running; systemd orders them by their After= lines and starts them again on every boot.
# No step aborts the others: each failure is logged and counted; the exit status is 0 only if
# every step worked.
# Hooks for tests: DL_UNIT_DIR, DL_BIN_DIR, DL_PROFILE_DIR, and the contract's directory variables.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=contract.sh
. "$here/contract.sh"
unit_dir=${DL_UNIT_DIR:-/etc/systemd/system}
bin_dir=${DL_BIN_DIR:-/usr/local/bin}
profile_dir=${DL_PROFILE_DIR:-/etc/profile.d}

log() { echo "dl-install: $*"; }
failed=0
step() {
  "$@" && return 0
  log "failed: $*"
  failed=$((failed + 1))
  return 1
}

read_units() {
  # shellcheck source=/dev/null  # written by the bootstrap
  units=$(. "$DL_NODE_ENV_FILE" && echo "$DL_UNITS")
}
units=""
step read_units
log "units of this node: ${units:-none}"

# Zip archives do not keep file modes; dl-torchrun is run through its link.
step chmod 0755 "$here"/*.sh
step mkdir -p "$unit_dir" "$bin_dir" "$profile_dir"
for unit in $units; do
  step install -m 0644 "$here/units/$unit" "$unit_dir/$unit"
done
step systemctl daemon-reload
for unit in $units; do
  step systemctl enable "$unit"
done

step ln -sfn "$here/dl_torchrun.sh" "$bin_dir/dl-torchrun"
# Login shells (SSM sessions) get the contract's names, as the node's scripts do.
login_profile() { printf '# written by dl-launcher\n. %s\n' "$here/contract.sh" > "$profile_dir/dl-launcher.sh"; }
step login_profile

for unit in $units; do
  step systemctl start --no-block "$unit"
done

if [ "$failed" -eq 0 ]; then
  log "done: units enabled and started"
else
  log "done, $failed step(s) failed"
  exit 1
fi
