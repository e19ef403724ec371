#!/usr/bin/env bash
# The vLLM backend's suite: a wheel of this tree (WHEEL, or one built here)
# installed into vLLM's virtualenv (VLLM_VENV, made by tools/vllm-venv.sh)
# by tools/vllm-rdt.sh, so that vLLM finds "librdt" through the wheel's
# entry point; then pytest over tests/vllm: the engines' contract, and a
# real vLLM synced end to end.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
venv=$(cd "${VLLM_VENV:?}" && pwd)
tools/vllm-rdt.sh "$venv" ${WHEEL:+"$WHEEL"}
cd tests/vllm
VLLM_CPU_KVCACHE_SPACE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider --timeout 600 .
