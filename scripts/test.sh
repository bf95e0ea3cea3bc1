#!/usr/bin/env bash
# Runs every test: unit, CDK assertions, cfn-lint, cdk-nag, shellcheck, moto-backed AWS calls.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PWD/node_modules/.bin:$PATH"
exec .venv/bin/python -m pytest -n 2 "$@"
