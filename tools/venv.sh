#!/usr/bin/env bash
# Usage: venv.sh VENV REQUIREMENTS.txt...
# Creates the test virtualenv VENV with PYTHON (default python3) unless it
# exists, then installs each pinned requirements file into it.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 VENV [REQUIREMENTS.txt...]" >&2; exit 2; }
venv=$1
shift
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
for req in "$@"; do
  "$venv/bin/pip" install -q -r "$req"
done
