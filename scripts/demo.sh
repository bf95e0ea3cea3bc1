#!/usr/bin/env bash
# The main job on the local default: what the selector picks for multi-node training and why,
# then the real CDK CLI deploying that profile into a local moto_server (no AWS account), what
# exists afterwards, and dl-launcher destroy (which keeps the checkpoint bucket).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PWD/node_modules/.bin:$PATH"
profile=${PROFILE:-multi-node-training}
echo "==> python -m dl_selector recommend --profile $profile --top 5"
python -m dl_selector recommend --profile "$profile" --top 5
echo
echo "==> cdk deploy -c profile=$profile into moto_server on 127.0.0.1"
exec python scripts/local_deploy.py --profile "$profile"
