#!/usr/bin/env bash
# Prints the path of a Python interpreter that has the pinned torch, timm and pytest of
# python/requirements.txt. The first run creates a virtual environment under
# ~/.cache/greenmim/venv-<hash of the requirements> and installs them from PyPI (the torch wheel
# and its CUDA libraries are several GB: a few minutes); later runs on the same machine reuse
# it. GREENMIM_PYTHON=/path/to/python uses that interpreter as it is; GREENMIM_VENV=DIR picks
# the environment's folder. Progress goes to stderr, the path alone to stdout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$root/python/requirements.txt"
if [ -n "${GREENMIM_PYTHON:-}" ]; then
  echo "$GREENMIM_PYTHON"
  exit 0
fi
py="${PYTHON:-python3}"
if ! command -v "$py" >/dev/null 2>&1 || ! "$py" -c "import venv, ensurepip" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "python_env: installing python3 and python3-venv" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip >&2
    py=python3
  else
    echo "python_env: need $py with the venv module (sudo apt-get install python3-venv)" >&2
    exit 1
  fi
fi
hash="$( (cat "$req"; "$py" -c 'import sys; print(sys.version_info[:2])') | sha256sum | cut -c1-12)"
venv="${GREENMIM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/greenmim/venv-$hash}"
if [ ! -f "$venv/.greenmim-complete" ]; then
  echo "python_env: installing $(grep -v '^#' "$req" | xargs) into $venv (first run only)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q -r "$req" >&2
  "$venv/bin/python" -c "import torch, timm, pytest" >&2
  touch "$venv/.greenmim-complete"
fi
echo "$venv/bin/python"
