#!/usr/bin/env bash
# Runs `python -m constructs_lib.runtime` with a Python that has boto3: DL_PYTHON if set, the
# DLAMI's PyTorch environment or system Python if they have it, else a small venv made once.
set -euo pipefail

LIB=${DL_LIB_DIR:-/usr/local/lib/dl-launcher}
export PYTHONPATH="$LIB/python${PYTHONPATH:+:$PYTHONPATH}"

for py in ${DL_PYTHON:-} /opt/pytorch/bin/python3 /opt/conda/bin/python3 /usr/bin/python3 /usr/local/bin/python3; do
  if [ -x "$py" ] && "$py" -c 'import boto3' >/dev/null 2>&1; then
    exec "$py" -m constructs_lib.runtime "$@"
  fi
done

venv="$LIB/venv"
if [ ! -x "$venv/bin/python3" ] || ! "$venv/bin/python3" -c 'import boto3' >/dev/null 2>&1; then
  echo "dl-runtime: no Python with boto3 on this AMI; creating $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install --quiet boto3
fi
exec "$venv/bin/python3" -m constructs_lib.runtime "$@"
