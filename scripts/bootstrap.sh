#!/usr/bin/env bash
# Creates or reuses .venv and node_modules so that a fresh machine with only Python 3.11+
# and Node 20 can run everything. Skips the installs when nothing they depend on changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi

stamp_inputs=$(cat pyproject.toml constraints.txt package.json package-lock.json | sha256sum | cut -d' ' -f1)
if [ ! -f .deps-stamp ] || [ "$(cat .deps-stamp)" != "$stamp_inputs" ] || [ ! -d node_modules/aws-cdk ]; then
  echo "==> installing Python packages into .venv and the pinned CDK CLI into node_modules, side by side"
  # The two installs wait mostly on the network and the disk: together they take the longer one's time.
  npm ci --no-audit --no-fund --loglevel=error &
  npm_pid=$!
  # pyproject.toml gives ranges; constraints.txt the exact versions the tests were run with.
  if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'; then
    kill "$npm_pid" 2>/dev/null || true
    exit 1
  fi
  wait "$npm_pid"
  echo "$stamp_inputs" > .deps-stamp
fi
# Byte-compile the project's own packages: environments that set PYTHONDONTWRITEBYTECODE would
# otherwise recompile them on every CLI start (about a quarter of `python -m dl_selector`'s time).
.venv/bin/python -m compileall -q dl_selector constructs_lib dl_stacks dl_launcher dl_core app.py >/dev/null
