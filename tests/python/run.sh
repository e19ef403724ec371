#!/usr/bin/env bash
# The Python suite: the wheel built once (Go runs inside its build, through
# tools/build-lib.sh), installed into the test virtualenv, then pytest over
# tests/python with the CUDA driver double for the tests that use it.
# Environment (paths relative to the repository root): VENV (the test
# virtualenv, made by tools/venv.sh), WHEEL_DIR, FAKECUDA (the driver
# double's library); RDT_NIXL_LIBRARY is passed on.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
venv=$(cd "${VENV:?}" && pwd)
wheel_dir=${WHEEL_DIR:?}
fakecuda=$(realpath "${FAKECUDA:?}")

rm -rf "$wheel_dir" bindings/python/build
"$venv/bin/pip" wheel -q --no-deps -w "$wheel_dir" ./bindings/python
"$venv/bin/pip" install -q --no-deps --force-reinstall "$wheel_dir"/rdt-*.whl
whl=$(realpath "$wheel_dir"/rdt-*.whl)
cd tests/python
RDT_WHEEL=$whl RDT_TEST_FAKECUDA=$fakecuda "$venv/bin/python" -m pytest -q -p no:cacheprovider .
