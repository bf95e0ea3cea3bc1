#!/usr/bin/env bash
# The main job on the local default: what the selector picks for multi-node training and why,
# then the CDK app synthesized for that pick (no AWS account, no network).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PWD/node_modules/.bin:$PATH"
profile=${PROFILE:-multi-node-training}
echo "==> python -m selector recommend --profile $profile --top 5"
python -m selector recommend --profile "$profile" --top 5
echo
echo "==> cdk synth -c profile=$profile"
cdk synth -c profile="$profile" --quiet
echo "templates in cdk.out/"
