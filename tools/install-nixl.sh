#!/usr/bin/env bash
# Usage: install-nixl.sh DIR REQUIREMENTS.txt
# NIXL for the nixl transport's tests: the pinned nixl-cu12 wheel (about
# 70 MB; it bundles UCX, and its DRAM path needs no GPU) unpacked into DIR
# without its torch dependency, with PYTHON's pip (default python3). Where it
# cannot be installed the nixl tests skip and say why, so a failed install
# is reported, not fatal.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 DIR REQUIREMENTS.txt" >&2; exit 2; }
dir=$1 req=$2
rm -rf "$dir"
"${PYTHON:-python3}" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps \
  --target "$dir" -r "$req" ||
  echo "nixl wheel not installed: the nixl transport's tests will skip"
mkdir -p "$dir"
touch "$dir/.ready"
