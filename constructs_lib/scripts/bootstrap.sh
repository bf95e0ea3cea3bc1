#!/bin/bash
# The node's first boot, run by cloud-init as user data. constructs_lib/userdata.py puts the
# contract's names (contract.sh) and this node's settings (a dl_settings function) ahead of it.
#   1. write the settings (node.env, the units' env files, the job command);
#   2. fetch the node bundle (a CDK asset: DL_BUNDLE_URL in node.env) with retries and backoff;
#   3. unpack it into DL_LIB_DIR and run its install.sh, which enables and starts the units.
# No step aborts the others (no set -e): each logs and goes on, so a transient failure never
# leaves a node without its job unit. Only a bundle that cannot be had stops the node: nothing
# could run without it, so the node says so in health.d/bootstrap and shuts down; the launch
# template's shutdown behaviour is terminate, so the capacity replaces it instead of billing it.
# (Run again by hand on a node that has a bundle, it keeps that one instead.) The deployer's own
# user data comes after this script and runs only if it did not stop.
# Hooks for tests: DL_BOOTSTRAP_LOG, DL_FETCH_ATTEMPTS, DL_FETCH_BACKOFF (seconds, doubled per
# retry, at most 60), and the contract's directory variables.

log_file=${DL_BOOTSTRAP_LOG:-/var/log/dl-launcher-bootstrap.log}
mkdir -p "$(dirname "$log_file")"
exec > >(tee -a "$log_file") 2>&1  # the console (through cloud-init) and our own log

log() { echo "dl-bootstrap: $*"; }
problems=()

health() {  # LEVEL MESSAGE (contract.HEALTH_LEVELS)
  if ! { mkdir -p "$DL_HEALTH_DIR" && echo "$*" > "$DL_HEALTH_DIR/bootstrap"; }; then
    log "could not write $DL_HEALTH_DIR/bootstrap"
  fi
}

# dl_put PATH < CONTENT: replace PATH whole (readers never see half a file). Used by dl_settings.
# Files under DL_ETC_DIR (node.env, the job command, the units' env files) may hold secrets the
# deployer passed: root only (0600), from the first byte (mktemp creates 0600). Others: 0644.
dl_put() {
  local tmp="" mode=0644
  case "$1" in "$DL_ETC_DIR"/*) mode=0600 ;; esac
  if mkdir -p "$(dirname "$1")" && tmp=$(mktemp "$1.XXXXXX") && cat > "$tmp" && chmod "$mode" "$tmp" \
      && mv -f "$tmp" "$1"; then
    log "wrote $1"
  else
    log "could not write $1"
    [ -n "$tmp" ] && rm -f "$tmp"
    problems+=("write $1")
  fi
}

fail() {
  health failed "$*"
  echo "dl-launcher: BOOTSTRAP FAILED: $*; shutting down so that this node is replaced, not billed idle"
  shutdown -h now || log "shutdown failed: stop this node by hand"
  exit 1
}

# download URL DEST: the AWS CLI (the DLAMI has v2), else any python3 with boto3.
download() {
  local cli py
  for cli in "$(command -v aws)" /usr/local/bin/aws /usr/bin/aws; do
    if [ -n "$cli" ] && [ -x "$cli" ]; then
      "$cli" s3 cp --only-show-errors "$1" "$2"
      return
    fi
  done
  for py in python3 /opt/pytorch/bin/python3 /opt/conda/bin/python3; do
    if "$py" -c 'import boto3' > /dev/null 2>&1; then
      "$py" -c 'import sys, boto3; b, k = sys.argv[1][5:].split("/", 1); boto3.client("s3").download_file(b, k, sys.argv[2])' "$1" "$2"
      return
    fi
  done
  log "no AWS CLI and no python3 with boto3 on this node"
  return 1
}

# fetch URL DIR: download and unpack into DIR (empty); a corrupt download counts as a failed try.
fetch() {
  local zip="$2.zip"
  { rm -rf "$2" "$zip" && mkdir -p "$2"; } || return 1
  download "$1" "$zip" || return 1
  if command -v unzip > /dev/null; then
    unzip -q -o "$zip" -d "$2" || return 1
  else
    python3 -m zipfile -e "$zip" "$2" || return 1
  fi
  rm -f "$zip"
  [ -f "$2/install.sh" ] || { log "the bundle has no install.sh"; return 1; }
}

log "starting: settings in $DL_ETC_DIR, bundle into $DL_LIB_DIR"
mkdir -p "$DL_ETC_DIR" "$DL_RUN_DIR" || log "could not create $DL_ETC_DIR or $DL_RUN_DIR"
dl_settings

# shellcheck source=/dev/null  # written just above
if ! { [ -f "$DL_NODE_ENV_FILE" ] && set -a && . "$DL_NODE_ENV_FILE" && set +a; }; then
  fail "no node settings in $DL_NODE_ENV_FILE"
fi
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-$DL_REGION}"

attempts=${DL_FETCH_ATTEMPTS:-8}
delay=${DL_FETCH_BACKOFF:-2}
stage="$DL_RUN_DIR/bundle.new"
try=1
until fetch "$DL_BUNDLE_URL" "$stage"; do
  if [ "$try" -ge "$attempts" ]; then
    rm -rf "$stage" "$stage.zip"
    if [ -f "$DL_LIB_DIR/install.sh" ]; then
      # A run by hand on a working node: what an earlier run installed keeps running.
      health degraded "could not fetch the node bundle $DL_BUNDLE_URL in $attempts tries; kept the one installed before"
      log "could not fetch the node bundle; kept the one installed before, changed nothing"
      exit 1
    fi
    fail "could not fetch the node bundle $DL_BUNDLE_URL in $attempts tries"
  fi
  log "fetching $DL_BUNDLE_URL failed (try $try of $attempts); next try in ${delay}s"
  sleep "$delay"
  delay=$((delay * 2 > 60 ? 60 : delay * 2))
  try=$((try + 1))
done

# New inodes for every file (--remove-destination): a script or module that is running keeps
# its old copy; files the bundle does not ship (a venv made on this node) stay.
if ! { mkdir -p "$DL_LIB_DIR" && cp -R --remove-destination "$stage/." "$DL_LIB_DIR/"; }; then
  fail "could not copy the node bundle into $DL_LIB_DIR"
fi
rm -rf "$stage"
log "installed $DL_BUNDLE_URL in $DL_LIB_DIR"

bash "$DL_LIB_DIR/install.sh" || problems+=("install.sh (see above)")
if [ ${#problems[@]} -eq 0 ]; then
  health ok "bundle $DL_BUNDLE_URL installed; units started: $DL_UNITS"
  log "done"
else
  health degraded "bundle $DL_BUNDLE_URL installed; failed: ${problems[*]}"
  log "done, with failures: ${problems[*]}"
fi
