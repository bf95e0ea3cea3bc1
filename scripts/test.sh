#!/usr/bin/env bash
# Runs every test: unit, CDK assertions, cfn-lint, cdk-nag, checkov, shellcheck, moto-backed AWS
# calls, the multi-node torchrun drill.
#   bash scripts/test.sh                                  everything, two workers (a file on one)
#   bash scripts/test.sh tests/runtime/test_cluster.py    just those files, in one process; checkov
#                                                         is installed only if one of them uses it
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
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
# checkov pins boto3==1.35.49, older than moto's instance records need: it gets a venv of its own.
CHECKOV=3.3.30
if [ "$needs_checkov" = 1 ] && [ "$(cat .venv-checkov/.version 2>/dev/null)" != "$CHECKOV" ]; then
  echo "==> installing checkov $CHECKOV into .venv-checkov"
  rm -rf .venv-checkov
  "${PYTHON:-python3}" -m venv .venv-checkov
  .venv-checkov/bin/python -m pip install --quiet --disable-pip-version-check "checkov==$CHECKOV"
  echo "$CHECKOV" > .venv-checkov/.version
fi
# The AWS CLI the nodes stage data with (aws s3 sync): a venv of its own, so that the simulated
# node's PATH, which holds .venv/bin, keeps "no AWS CLI" for the bootstrap's python fallback.
AWSCLI=1.45.11
if [ "$(cat .venv-awscli/.version 2>/dev/null)" != "$AWSCLI" ]; then
  echo "==> installing the AWS CLI $AWSCLI into .venv-awscli"
  rm -rf .venv-awscli
  "${PYTHON:-python3}" -m venv .venv-awscli
  # Not with constraints.txt: the CLI pins its own botocore, docutils and rsa.
  .venv-awscli/bin/python -m pip install --quiet --disable-pip-version-check "awscli==$AWSCLI"
  echo "$AWSCLI" > .venv-awscli/.version
fi
export PATH="$PWD/.venv/bin:$PWD/node_modules/.bin:$PATH"
if [ "$files" = 1 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
