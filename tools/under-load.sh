#!/usr/bin/env bash
# Runs a command with one busy process per core beside it, the way the test
# suites must pass on a loaded machine: a test that fails only under load
# has found a defect. The busy processes end with the command (or when this
# script is interrupted), and the command's exit status is the script's.
#
#   tools/under-load.sh COMMAND [ARG...]
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
cores=$(nproc)
hogs=()
stop_hogs() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_hogs EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$cores"); do
  # A shell loop: busy on one core, no memory, nothing to install.
  sh -c 'while :; do :; done' &
  hogs+=($!)
done
echo "under-load: $cores busy processes beside: $*" >&2
status=0
"$@" || status=$?
echo "under-load: '$*' exited with $status" >&2
exit "$status"
