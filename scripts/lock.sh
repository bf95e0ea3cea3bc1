#!/usr/bin/env bash
# Rebuilds constraints.txt: resolves pyproject.toml's ranges afresh in a throwaway venv and
# records every version. Run it after changing a pin or a range, then run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
{
  echo "# The exact versions the tests run with; scripts/bootstrap.sh installs the project with -c this file."
  echo "# pyproject.toml holds the ranges users get. Rebuild after changing a pin: scripts/lock.sh"
  # A local build label (torch's +cpu) is not on the package index; the plain version matches it.
  "$tmp/venv/bin/python" -m pip freeze --exclude-editable | sed -E 's/^(torch==[^+]+)\+.*/\1/'
} > constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) packages"
