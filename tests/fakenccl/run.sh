#!/usr/bin/env bash
# The nccl transport and groups, on machines without GPUs: against the test
# double of NCCL (this directory: sockets between the ranks) on top of the
# CUDA driver double with three devices. The Go tests run once more with an
# abort that peers do not notice (as with NCCL's shared-memory transports),
# for the tests of failed transfers; then the C, C++ and Python group tests
# (the Python nccl tests need torch with a CUDA device and skip). Only these
# get the doubles. See docs/transports.md, "nccl".
# Environment (paths relative to the repository root): FAKECUDA, FAKENCCL
# (the doubles' libraries), CMAKE_DIR (a configured CMake build with tests),
# VENV (the test virtualenv), LIBRDT, GO and CMAKE (default go and cmake).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
go=${GO:-go}
cmake=${CMAKE:-cmake}
fakecuda=$(realpath "${FAKECUDA:?}")
fakenccl=$(realpath "${FAKENCCL:?}")
cmake_dir=$(realpath "${CMAKE_DIR:?}")
venv=$(realpath "${VENV:?}")
librdt=$(realpath "${LIBRDT:?}")
on_doubles() {
  env -u CUDA_VISIBLE_DEVICES RDT_CUDA_LIBRARY="$fakecuda" RDT_FAKECUDA_DEVICES=3 RDT_NCCL_LIBRARY="$fakenccl" "$@"
}

on_doubles "$go" test -race -count=1 ./transports/nccl/...
RDT_FAKENCCL_ABORT=silent on_doubles "$go" test -race -count=1 -run 'Abort|Dies|Fail|Destroy' ./transports/nccl/...
"$cmake" --build "$cmake_dir" -j2 --target test_groups test_rdt_cpp
(cd "$cmake_dir" && on_doubles ctest --output-on-failure -R '^(test_groups|cpp[.]Groups[.].*)$')
cd tests/python
PYTHONPATH=$root/bindings/python RDT_LIBRARY=$librdt \
  on_doubles "$venv/bin/python" -m pytest -q -p no:cacheprovider test_groups.py test_gpu_nccl.py
