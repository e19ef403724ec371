#!/usr/bin/env bash
# Usage: tests/gpu-pack/run.sh PACK WORK
# The GPU pack (docs/gpu.md) on this machine, which has no GPU: PACK/run.sh
# runs to its end three times, its output under WORK, and check_summary.py
# checks each summary.json against what that run must report:
#  1. on the test doubles of the CUDA driver and NCCL (three devices): the Go
#     tests of the CUDA loader, cuda_ipc and nccl pass on them, nixl passes on
#     the packed NIXL, and the steps that need a real GPU (torch's CUDA) are
#     skipped, each with its reason;
#  2. without any CUDA: every GPU step skipped with its reason, nixl passes;
#  3. with no time left: every step skipped, the summary still written.
# Every run must exit 0 with no step failed, and the pack must fit 64 MiB.
# Environment: FAKECUDA, FAKENCCL (the doubles' libraries), GPU_PYTHON
# (python3 with numpy and pytest; the test virtualenv).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 PACK WORK" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
pack=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)
fakecuda=$(realpath "${FAKECUDA:?}")
fakenccl=$(realpath "${FAKENCCL:?}")
python=${GPU_PYTHON:?}
if nvidia-smi -L >/dev/null 2>&1 || compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  echo "gpu-pack-test: SKIPPED: this machine has an NVIDIA GPU; run the pack itself there: $pack/run.sh OUT (docs/gpu.md)"
  exit 0
fi
no_cuda=(env -u RDT_CUDA_LIBRARY -u RDT_FAKECUDA_DEVICES -u RDT_NCCL_LIBRARY -u RDT_NIXL_LIBRARY
  -u RDT_REQUIRE_GPU -u CUDA_VISIBLE_DEVICES -u RDT_GPU_PACK_SECONDS GPU_PYTHON="$python")

run() { # NAME EXPECTATION ENV-ARGUMENTS...: runs the pack into WORK/NAME and checks it
  local name=$1 expect=$2
  shift 2
  rm -rf "${work:?}/$name"
  echo "gpu-pack-test: $name"
  "${no_cuda[@]}" "$@" "$pack/run.sh" "$work/$name" ||
    { echo "gpu-pack-test: FAILED: run.sh exited with status $? ($name); see $work/$name/run.log" >&2; exit 1; }
  "$python" "$here/check_summary.py" "$expect" "$work/$name"
}

run doubles doubles RDT_CUDA_LIBRARY="$fakecuda" RDT_FAKECUDA_DEVICES=3 RDT_NCCL_LIBRARY="$fakenccl"
run no-cuda no-cuda
run no-time no-time RDT_GPU_PACK_SECONDS=0
