#!/usr/bin/env bash
# Runs every test: unit, CDK assertions, cfn-lint, cdk-nag, checkov, shellcheck, moto-backed AWS
# calls, the multi-node torchrun drill.
#   bash scripts/test.sh                                  everything, two workers (a file on one)
#   bash scripts/test.sh tests/runtime/test_cluster.py    just those files, in one process; checkov
#                                                         is installed only if one of them uses it
set -euo pipefail
cd "$(dirname "$0")/.."
needs_checkov=0
files=0
for arg in "$@"; do
  path="${arg%%::*}"
  if [ -f "$path" ]; then
    files=1
    if grep -qE "checkov|cdk_checks" "$path"; then needs_checkov=1; fi
  elif [ -d "$path" ]; then
    needs_checkov=1
  fi
done
if [ "$files" = 0 ]; then needs_checkov=1; fi
# The tools' venvs install in the background while bootstrap.sh installs the rest: each waits
# mostly on the network and the disk. A failed install fails the run with its own output.
side=()
venv_of() {  # venv_of DIR VERSION PIP-ARGS...: DIR holds exactly that version, or is rebuilt
  local dir=$1 version=$2
  shift 2
  if [ "$(cat "$dir/.version" 2>/dev/null)" = "$version" ]; then return 0; fi
  echo "==> installing $* into $dir"
  rm -rf "$dir"
  "${PYTHON:-python3}" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
  echo "$version" > "$dir/.version"
}
# checkov pins boto3==1.35.49, older than moto's instance records need: it gets a venv of its own.
CHECKOV=3.3.30
if [ "$needs_checkov" = 1 ]; then
  venv_of .venv-checkov "$CHECKOV" "checkov==$CHECKOV" > .venv-checkov.log 2>&1 &
  side+=("$!:.venv-checkov.log")
fi
# The AWS CLI the nodes stage data with (aws s3 sync): a venv of its own, so that the simulated
# node's PATH, which holds .venv/bin, keeps "no AWS CLI" for the bootstrap's python fallback.
# Not with constraints.txt: the CLI pins its own botocore, docutils and rsa.
AWSCLI=1.45.11
venv_of .venv-awscli "$AWSCLI" "awscli==$AWSCLI" > .venv-awscli.log 2>&1 &
side+=("$!:.venv-awscli.log")
bash scripts/bootstrap.sh
for job in "${side[@]}"; do
  if ! wait "${job%%:*}"; then
    cat "${job#*:}"
    exit 1
  fi
  cat "${job#*:}"
done
export PATH="$PWD/.venv/bin:$PWD/node_modules/.bin:$PATH"
if [ "$files" = 1 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
