#!/usr/bin/env bash
# The GPU tests of the CUDA loader and of cuda_ipc, on machines without a
# GPU: against the test double of the CUDA driver (this directory), with two
# devices, then again without peer access for the tests that care. Only
# these packages get it (nixl would hand its fake device pointers to UCX);
# see docs/transports.md, "Testing GPU code without a GPU". Then the demo's
# GPU rows over the double, which the demo checks itself (RDT_REQUIRE_GPU=1:
# no GPU rows is a failure).
# Environment (paths relative to the repository root): FAKECUDA (the
# double's libcuda.so.1), DEMO (the demo program, examples/c/demo.c), GO
# (default go).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
go=${GO:-go}
fakecuda=$(realpath "${FAKECUDA:?}")
demo=$(realpath "${DEMO:?}")
pkgs=(./transports/internal/cuda/... ./transports/cuda_ipc/...)
on_double() { env -u CUDA_VISIBLE_DEVICES RDT_CUDA_LIBRARY="$fakecuda" RDT_FAKECUDA_DEVICES=2 "$@"; }

on_double "$go" test -race -count=1 "${pkgs[@]}"
RDT_FAKECUDA_PEER_ACCESS=0 on_double "$go" test -race -count=1 -run 'TwoDevices|NumbersDevicesDifferently|PeerDevice|OnTheLocalDevice' "${pkgs[@]}"
# nixl kept out of the demo: it would hand UCX fake device pointers.
RDT_REQUIRE_GPU=1 RDT_NIXL_LIBRARY=/nonexistent on_double "$demo"
