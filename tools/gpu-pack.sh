#!/usr/bin/env bash
# Usage: gpu-pack.sh [PACK]   (PACK defaults to build/gpu-pack)
# Builds the GPU pack (docs/gpu.md): everything rdt's GPU checks need, for a
# GPU machine with no network access and no Go, in one folder small enough
# to upload with the working tree (64 MiB):
#   run.sh          the checks (tools/gpu-pack/run.sh), run there as PACK/run.sh OUT;
#   pack.json       what the pack holds and which commit it was built from;
#   payload.tar.xz  the rdt Python package with librdt.so inside, the GPU
#                   tests of tests/python and their helpers, bench/gpu_bench.py,
#                   the Go tests of the GPU transports compiled (go test -c,
#                   stripped), and NIXL's libraries for CUDA 13, cut down to
#                   libnixl_capi.so, the UCX plugin and what they load.
# C code is compiled by zig for glibc 2.17 as for the wheels
# (tools/zig-env.sh, tools/zig-cc.sh), so the pack's own binaries load on any
# host that torch's wheels install on; NIXL's libraries need glibc 2.28, as
# torch's do (checked below).
# The NIXL wheel (tools/gpu-pack/nixl-cu13.txt, pinned by hash) is
# downloaded once into build/gpu-pack-cache. Without network and without
# that copy the build fails, unless RDT_GPU_PACK_OFFLINE_SKIP=1: then the pack
# holds no NIXL and run.sh reports the NIXL checks skipped, saying why.
# Environment: GO (default go), PYTHON (default python3), GPU_GO_TAGS (build
# tags of the GPU tests, as for make gpu-test).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pack=${1:-build/gpu-pack}
mkdir -p "$pack"
pack=$(cd "$pack" && pwd)
go=${GO:-go}
python=${PYTHON:-python3}

CARRY_LIMIT=$((64 << 20))  # what a GPU machine's upload takes beside the working tree
GLIBC_TARGET=2.17          # zig's target for the pack's own C code, as the wheels'
GLIBC_FLOOR=2.28           # torch's and nixl-cu13's wheels are manylinux_2_28
# The Go packages with tests that use a GPU, CUDA or NIXL.
GO_PACKAGES=(./transports/internal/cuda ./transports/cuda_ipc ./transports/nccl ./transports/nixl)
# tests/python files the GPU tests run or import.
PY_TESTS=(test_gpu.py test_gpu_nccl.py test_gpu_nixl.py test_gpu_vmm.py conftest.py gpu_env.py workers.py transports_for_tests.py)
# NIXL: the library rdt loads and the backend it uses (under the wheel's
# .nixl_cu13.mesonpy.libs), and the UCX modules for shared memory and CUDA
# (under nixl_cu13.libs/ucx, where UCX looks next to libucs); the libraries
# they need are added from the wheel by following DT_NEEDED.
NIXL_ROOTS=(.nixl_cu13.mesonpy.libs/libnixl_capi.so .nixl_cu13.mesonpy.libs/plugins/libplugin_UCX.so
  nixl_cu13.libs/ucx/libuct_cma.so.0.0.0 nixl_cu13.libs/ucx/libuct_cuda.so.0.0.0
  nixl_cu13.libs/ucx/libucm_cuda.so.0.0.0)
NIXL_DIRS=(.nixl_cu13.mesonpy.libs nixl_cu13.libs)
NIXL_REQ=tools/gpu-pack/nixl-cu13.txt

say() { echo "gpu-pack: $*"; }
fail() {
  echo "gpu-pack: FAILED: $*" >&2
  exit 1
}

stage=$root/build/gpu-pack-stage
cache=$root/build/gpu-pack-cache
rm -rf "$stage" "$pack/run.sh" "$pack/pack.json" "$pack/payload.tar.xz" # no stale pack if this build fails
mkdir -p "$stage/python/tests" "$stage/python/bench" "$stage/go" "$cache"

# ---- librdt.so inside the Python package, where the package looks first
. tools/zig-env.sh
ZIG_CC="$root/tools/zig-cc.sh x86_64-linux-gnu.$GLIBC_TARGET"
for f in $(git ls-files bindings/python/rdt); do
  case $f in *.py | *.typed) install -D -m 644 "$f" "$stage/python/rdt/${f#bindings/python/rdt/}" ;; esac
done
# zig links no unwinder by itself: its static libunwind serves the traceback
# (tools/build-wheels.sh builds the wheels' library the same way).
CC=$ZIG_CC CGO_LDFLAGS="${CGO_LDFLAGS:-} -lunwind" GO=$go tools/build-lib.sh "$stage/python/rdt/librdt.so"
say "built librdt.so ($(du -h "$stage/python/rdt/librdt.so" | cut -f1))"

# ---- the Go GPU tests, compiled; each re-executes itself (os.Args[0]) for its child processes
CGO_ENABLED=1 CC=$ZIG_CC "$go" test -c -trimpath -tags "${GPU_GO_TAGS:-}" -ldflags='-s -w' \
  -o "$stage/go/" "${GO_PACKAGES[@]}"
say "built the Go test binaries: $(cd "$stage/go" && ls | tr '\n' ' ')"

# ---- the Python GPU tests and the GPU benchmark
for f in "${PY_TESTS[@]}"; do cp "tests/python/$f" "$stage/python/tests/"; done
cp bench/gpu_bench.py "$stage/python/bench/"
cp tools/nccl-library.py tools/gpu-pack/machine.py "$stage/"

# ---- NIXL for CUDA 13
nixl_hash=$(grep -o 'sha256:[0-9a-f]*' "$NIXL_REQ" | cut -d: -f2)
nixl_pin=$(grep -o '^nixl-cu13==[^ ]*' "$NIXL_REQ")
wheel=""
for w in "$cache"/nixl_cu13-*.whl; do
  [ -f "$w" ] && [ "$(sha256sum "$w" | cut -d' ' -f1)" = "$nixl_hash" ] && wheel=$w
done
if [ -z "$wheel" ]; then
  rm -f "$cache"/nixl_cu13-*.whl
  # The wheel of the GPU machine's Python and platform, whatever this host's.
  if "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --platform manylinux_2_28_x86_64 --require-hashes -r "$NIXL_REQ" -d "$cache"; then
    wheel=$(ls "$cache"/nixl_cu13-*.whl)
  elif [ "${RDT_GPU_PACK_OFFLINE_SKIP:-0}" = 1 ]; then
    say "SKIPPED NIXL: $nixl_pin cannot be downloaded (RDT_GPU_PACK_OFFLINE_SKIP=1); the pack holds no NIXL"
  else
    fail "$nixl_pin cannot be downloaded; set RDT_GPU_PACK_OFFLINE_SKIP=1 to build a pack without NIXL on a host without network"
  fi
fi
if [ -n "$wheel" ]; then
  unpacked=$root/build/gpu-pack-nixl-wheel
  rm -rf "$unpacked"
  "$python" - "$wheel" "$unpacked" "${NIXL_DIRS[@]}" <<'PY'
import sys, zipfile
wheel, dest, dirs = sys.argv[1], sys.argv[2], tuple(d + "/" for d in sys.argv[3:])
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [m for m in z.namelist() if m.startswith(dirs)])
PY
  # Every library the roots need, transitively, that the wheel has; the
  # rest (libc, libstdc++, libssl, the CUDA driver) is the host's.
  declare -A kept=()
  queue=("${NIXL_ROOTS[@]}")
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}
    queue=("${queue[@]:1}")
    [ -n "${kept[$f]:-}" ] && continue
    [ -f "$unpacked/$f" ] || fail "$nixl_pin has no $f"
    kept[$f]=1
    for needed in $(readelf -d "$unpacked/$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      for d in "${NIXL_DIRS[@]}"; do
        if [ -f "$unpacked/$d/$needed" ]; then
          queue+=("$d/$needed")
          break
        fi
      done
    done
  done
  for f in "${!kept[@]}"; do install -D -m 755 "$unpacked/$f" "$stage/nixl/$f"; done
  rm -rf "$unpacked"
  # Symbols and debug sections are most of their size; the loader needs neither.
  find "$stage/nixl" -type f -exec strip --strip-unneeded {} +
  echo "$nixl_pin sha256:$nixl_hash" >"$stage/nixl/FROM"
  say "NIXL: ${#kept[@]} libraries from $(basename "$wheel") ($(du -sh "$stage/nixl" | cut -f1) unpacked, stripped)"
else
  mkdir -p "$stage/nixl"
  echo "$nixl_pin could not be downloaded when the pack was built (RDT_GPU_PACK_OFFLINE_SKIP=1)" >"$stage/nixl/NOT-PACKED"
fi

# ---- every ELF file against the glibc that torch's wheels need anyway
newest=$(find "$stage" -type f \( -name '*.so*' -o -name '*.test' \) -exec readelf -V -W {} + 2>/dev/null |
  grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
[ "$(printf '%s\n%s\n' "$newest" "$GLIBC_FLOOR" | sort -V | tail -n 1)" = "$GLIBC_FLOOR" ] ||
  fail "the pack needs GLIBC_$newest, newer than torch's glibc $GLIBC_FLOOR"
say "the newest glibc symbol any packed binary needs: GLIBC_$newest"

# ---- the pack
rm -rf "$pack"
mkdir -p "$pack"
cp tools/gpu-pack/run.sh "$pack/run.sh"
chmod 755 "$pack/run.sh"
(cd "$stage" && find . -type f | LC_ALL=C sort | tar -cf - --owner=0 --group=0 -T -) | xz -T2 -6 >"$pack/payload.tar.xz"
commit=$(git rev-parse HEAD)
git diff --quiet HEAD -- && dirty=false || dirty=true
"$python" - "$stage" "$pack" "$commit" "$dirty" "$("$go" env GOVERSION)" "$GLIBC_TARGET" "$newest" \
  "${GPU_GO_TAGS:-}" <<'PY'
import json, os, sys, time
stage, pack, commit, dirty, go, target, newest, tags = sys.argv[1:]
files = sorted(os.path.relpath(os.path.join(d, f), stage) for d, _, fs in os.walk(stage) for f in fs)
def under(top):
    return [f for f in files if f.startswith(top + "/")]
nixl = open(os.path.join(stage, "nixl", "FROM" if os.path.exists(os.path.join(stage, "nixl", "FROM"))
                         else "NOT-PACKED")).read().strip()
info = {
    "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "commit": commit, "uncommitted_changes": dirty == "true",
    "go": go, "go_tags": tags, "c_compiler": f"zig for x86_64-linux-gnu.{target}",
    "newest_glibc_symbol": newest,
    "nixl": nixl if os.path.exists(os.path.join(stage, "nixl", "FROM")) else "not packed: " + nixl,
    "payload_bytes": os.path.getsize(os.path.join(pack, "payload.tar.xz")),
    "unpacked_bytes": sum(os.path.getsize(os.path.join(stage, f)) for f in files),
    "contents": {"go tests": [os.path.basename(f) for f in under("go")],
                 "python files": len(under("python")),
                 "nixl libraries": len([f for f in under("nixl") if ".so" in f])},
}
with open(os.path.join(pack, "pack.json"), "w") as f:
    json.dump(info, f, indent=1)
    f.write("\n")
PY
rm -rf "$stage"
size=$(du -sb "$pack" | cut -f1)
[ "$size" -le "$CARRY_LIMIT" ] ||
  fail "the pack is $size bytes, over the $CARRY_LIMIT a GPU machine takes; split it (docs/gpu.md)"
say "$pack: $size bytes ($((size * 100 / CARRY_LIMIT))% of 64 MiB): run.sh, pack.json, payload.tar.xz ($(du -h "$pack/payload.tar.xz" | cut -f1))"
