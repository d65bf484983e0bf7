#!/usr/bin/env bash
# Creates target/venv with the pinned test requirements, once: re-runs only when
# scripts/requirements-test.txt changes. Prints the venv's python path last.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/target/venv"
req="$root/scripts/requirements-test.txt"
stamp="$venv/.installed-$(sha256sum "$req" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "setting up the Python test environment in $venv ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
echo "$venv/bin/python"
