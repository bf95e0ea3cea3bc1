#!/usr/bin/env bash
# Runs every test: unit, CDK assertions, cfn-lint, cdk-nag, checkov, shellcheck, moto-backed AWS
# calls, the multi-node torchrun drill.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# checkov pins boto3==1.35.49, older than moto's instance records need: it gets a venv of its own.
CHECKOV=3.3.30
if [ "$(cat .venv-checkov/.version 2>/dev/null)" != "$CHECKOV" ]; then
  echo "==> installing checkov $CHECKOV into .venv-checkov"
  rm -rf .venv-checkov
  "${PYTHON:-python3}" -m venv .venv-checkov
  .venv-checkov/bin/python -m pip install --quiet --disable-pip-version-check "checkov==$CHECKOV"
  echo "$CHECKOV" > .venv-checkov/.version
fi
export PATH="$PWD/.venv/bin:$PWD/node_modules/.bin:$PATH"
exec .venv/bin/python -m pytest -n 2 "$@"
