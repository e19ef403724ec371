#!/usr/bin/env bash
# Usage: vllm-rdt.sh VENV [WHEEL]
# Installs rdt into vLLM's virtualenv VENV (made by tools/vllm-venv.sh) as
# a wheel, WHEEL or one built here from this tree, so that vLLM finds the
# "librdt" backend through the wheel's vllm.general_plugins entry point.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 VENV [WHEEL]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(cd "$1" && pwd)
wheel=${2:-}
if [ -z "$wheel" ]; then
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  "$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps -w "$dir" "$root/bindings/python"
  wheel=$(ls "$dir"/rdt-*.whl)
fi
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
