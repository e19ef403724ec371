#!/usr/bin/env bash
# Usage: tests/wheels/run.sh [DIST]   (DIST: where `make wheels` put them, dist/)
# The wheel test (docs/packaging.md, "Testing the wheels"):
#  1. auditwheel show reports, for each wheel, the manylinux tag it carries;
#  2. the x86_64 wheel installs into a fresh virtualenv with no Go on PATH and
#     passes tests/wheels/smoke.py (two processes, cma, shm and tcp), and its
#     console script runs `rdt info` and `rdt doctor --require cma,shm,tcp`;
#  3. the aarch64 wheel passes the same smoke test under qemu-user, with
#     Debian bookworm's qemu-aarch64-static and an arm64 sysroot unpacked
#     from pinned Debian packages (no root, no binfmt);
#  4. the sdist still builds a wheel with Go.
# Downloads (PyPI, Debian) that fail make the test fail, unless
# RDT_WHEEL_TEST_OFFLINE_SKIP=1, which turns that into a skip that says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
dist=$(cd "${1:-dist}" && pwd)
work=$root/build/wheel-test
tools=$root/build/wheel-tools
constraints=$root/tests/wheels/constraints.txt
smoke=$root/tests/wheels/smoke.py
GLIBC_TAG=manylinux_2_17
PY_AARCH64=3.11 # the sysroot's Python (Debian bookworm's)

say() { echo "wheel-test: $*"; }
fail() {
  echo "wheel-test: FAILED: $*" >&2
  exit 1
}
unreachable() { # what could not be downloaded
  if [ "${RDT_WHEEL_TEST_OFFLINE_SKIP:-0}" = 1 ]; then
    say "SKIPPED: $* cannot be downloaded (RDT_WHEEL_TEST_OFFLINE_SKIP=1)"
    exit 0
  fi
  fail "$* cannot be downloaded; set RDT_WHEEL_TEST_OFFLINE_SKIP=1 to skip this test on a host without network"
}

[ "$(uname -m)" = x86_64 ] || {
  say "SKIPPED: this test runs on an x86_64 host (the x86_64 wheel natively, the aarch64 one under qemu-user); this host is $(uname -m)"
  exit 0
}
[ -x "$tools/bin/auditwheel" ] || fail "$tools has no auditwheel; run make wheels first"
mkdir -p "$work"

the_wheel() { # arch
  local found=("$dist"/rdt-*-py3-none-"${GLIBC_TAG}_$1".*.whl)
  [ ${#found[@]} = 1 ] && [ -f "${found[0]}" ] || fail "expected one ${GLIBC_TAG}_$1 wheel in $dist, found: ${found[*]}"
  echo "${found[0]}"
}
wheel_x86_64=$(the_wheel x86_64)
wheel_aarch64=$(the_wheel aarch64)

# ---- 1. auditwheel: the tag each wheel carries is the one its library allows
for wheel in "$wheel_x86_64" "$wheel_aarch64"; do
  name=$(basename "$wheel" .whl)
  carried=${name##*-}    # the platform tags, e.g. manylinux_2_17_x86_64.manylinux2014_x86_64
  carried=${carried%%.*} # the first (PEP 600) one
  shown=$("$tools/bin/auditwheel" show "$wheel" 2>&1 | tr -s ' \n' '  ') || fail "auditwheel show $wheel: $shown"
  say "auditwheel show $(basename "$wheel"): $shown"
  case $shown in
  *"consistent with the following platform tag: \"$carried\""*) ;;
  *) fail "auditwheel does not report $carried, the tag $(basename "$wheel") carries" ;;
  esac
  case $shown in
  *"following external shared libraries are required"*) fail "$(basename "$wheel") needs libraries outside the manylinux policy" ;;
  esac
done

# ---- 2. x86_64: a fresh virtualenv, no Go anywhere on PATH ------------------
base_python=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
no_go_path=""
IFS=: read -ra path_dirs <<<"$PATH"
for dir in "${path_dirs[@]}"; do
  [ -n "$dir" ] && [ ! -x "$dir/go" ] && no_go_path=$no_go_path${no_go_path:+:}$dir
done
venv=$work/venv-x86_64
rm -rf "$venv"
"$base_python" -m venv "$venv"
no_go() { env -u GO -u GOROOT -u RDT_LIBRARY -u PYTHONPATH PATH="$venv/bin:$no_go_path" "$@"; }
if no_go sh -c 'command -v go' >/dev/null; then
  fail "go is still found on the test's PATH: $(no_go sh -c 'command -v go')"
fi
say "x86_64: go is not on the test's PATH (command -v go finds nothing)"
pypi_x86_64=$work/pypi-x86_64
no_go pip download -q -d "$pypi_x86_64" -c "$constraints" --only-binary=:all: numpy ||
  unreachable "numpy (pinned in tests/wheels/constraints.txt) from PyPI"
no_go pip install -q --no-index --find-links "$pypi_x86_64" -c "$constraints" "$wheel_x86_64" ||
  fail "pip install $(basename "$wheel_x86_64") into a fresh virtualenv"
# From / so that nothing of the repository can be imported instead.
(cd / && no_go timeout -k 10 300 python "$smoke") || fail "the x86_64 smoke test"
# The console script came with the wheel, and the host's transports work.
(cd / && no_go timeout -k 10 120 rdt info) || fail "rdt info from the installed wheel"
(cd / && no_go timeout -k 10 300 rdt doctor --require cma,shm,tcp) || fail "rdt doctor --require cma,shm,tcp from the installed wheel"

# ---- 3. aarch64 under qemu-user ---------------------------------------------
# Debian bookworm packages, pinned: path in the mirror, sha256. The sysroot is
# the smallest set that runs Python with ctypes, sockets and numpy (numpy's
# bundled OpenBLAS needs libgcc_s and libstdc++).
DEBIAN_MIRROR=https://deb.debian.org
DEBS=(
  "debian/pool/main/q/qemu/qemu-user-static_7.2+dfsg-7+deb12u18+b3_amd64.deb c3e3ba2bd87f8c5b9a5da5ef21b5a3b82d7c63b89dd448d9ddaa4eabc5b6e402"
  "debian/pool/main/g/glibc/libc6_2.36-9+deb12u14_arm64.deb 01f4330719fd4f65580e16ea5a0527f372fca750e8f588d26deaf09f2d3b1cf4"
  "debian/pool/main/g/gcc-12/libgcc-s1_12.2.0-14+deb12u1_arm64.deb 576926b283613db80168ddf76380a3bd877602778cf0d226caa7bfbfa71eacf3"
  "debian/pool/main/g/gcc-12/libstdc++6_12.2.0-14+deb12u1_arm64.deb 26e138c677a985775331373828a6c286c551ff397cb735d00e2383cb273d1cb2"
  "debian/pool/main/libf/libffi/libffi8_3.4.4-1_arm64.deb 80b5c36177dc0e29d531c7eddbed3cc7355cb490e49f8cfa5959572d161f27b3"
  "debian/pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_arm64.deb 52b8b8a145bbe1956bba82034f77022cbef0c3d0885c9e32d9817a7932fe1913"
  "debian-security/pool/updates/main/e/expat/libexpat1_2.5.0-1+deb12u5_arm64.deb 4a733e7f636de4a4483e3e5d7b02dc8e788b115361a04dd58df89461ce2ae65a"
  "debian-security/pool/updates/main/p/python3.11/python3.11-minimal_3.11.2-6+deb12u9_arm64.deb 617855dbf3299e03873926c75d61feaf3d36924586aecc1951a0b965a95bc694"
  "debian-security/pool/updates/main/p/python3.11/libpython3.11-minimal_3.11.2-6+deb12u9_arm64.deb dd9847d2f77c5a924b1d3dd953b81f161db9374c94d03b9216191925350928c3"
  "debian-security/pool/updates/main/p/python3.11/libpython3.11-stdlib_3.11.2-6+deb12u9_arm64.deb 9937cbe3f647aa89a590fec647438ce02098c113d1c6f70e4cb1230c368d42a4"
)
command -v dpkg-deb >/dev/null || {
  say "SKIPPED (aarch64 only): unpacking Debian's packages needs dpkg-deb, which this host lacks; the x86_64 wheel passed"
  exit 0
}
debs=$work/debs
sysroot=$work/sysroot-aarch64
qemu_root=$work/qemu
mkdir -p "$debs"
rm -rf "$sysroot" "$qemu_root"
for entry in "${DEBS[@]}"; do
  read -r path sha256 <<<"$entry"
  file=$debs/$(basename "$path")
  if ! echo "$sha256  $file" | sha256sum -c --quiet - >/dev/null 2>&1; then
    curl -fsSL --retry 2 -o "$file.part" "$DEBIAN_MIRROR/$path" || unreachable "$DEBIAN_MIRROR/$path"
    echo "$sha256  $file.part" | sha256sum -c --quiet - || fail "$(basename "$path") does not match its pinned sha256"
    mv "$file.part" "$file"
  fi
  case $file in
  *qemu-user-static*) dpkg-deb -x "$file" "$qemu_root" ;;
  *) dpkg-deb -x "$file" "$sysroot" ;;
  esac
done
qemu=$qemu_root/usr/bin/qemu-aarch64-static
guest_python=$sysroot/usr/bin/python$PY_AARCH64
"$qemu" -L "$sysroot" "$guest_python" -c 'import ctypes, socket, select, pickle' ||
  fail "the arm64 Python in $sysroot does not run under $qemu"

pypi_aarch64=$work/pypi-aarch64
cross=(--only-binary=:all: --platform manylinux2014_aarch64 --python-version "$PY_AARCH64" --implementation cp)
no_go pip download -q -d "$pypi_aarch64" -c "$constraints" "${cross[@]}" numpy ||
  unreachable "numpy for aarch64 (pinned in tests/wheels/constraints.txt) from PyPI"
target=$work/target-aarch64
rm -rf "$target"
no_go pip install -q --no-index --find-links "$pypi_aarch64" -c "$constraints" "${cross[@]}" --target "$target" \
  "$wheel_aarch64" numpy || fail "pip install --target of $(basename "$wheel_aarch64")"
(cd / && no_go PYTHONPATH="$target" PYTHONNOUSERSITE=1 RDT_SMOKE_EXEC="$qemu -L $sysroot" \
  timeout -k 10 300 "$qemu" -L "$sysroot" "$guest_python" "$smoke" --qemu) || fail "the aarch64 smoke test under qemu-user"
(cd / && no_go PYTHONPATH="$target" PYTHONNOUSERSITE=1 timeout -k 10 300 "$qemu" -L "$sysroot" "$guest_python" -m rdt info) ||
  fail "python -m rdt info under qemu-user"

# ---- 4. the sdist builds a wheel wherever Go is ------------------------------
sdists=("$dist"/rdt-*.tar.gz)
[ ${#sdists[@]} = 1 ] && [ -f "${sdists[0]}" ] || fail "expected one sdist in $dist, found: ${sdists[*]}"
command -v "${GO:-go}" >/dev/null || fail "building from the sdist needs Go (GO or go on PATH)"
from_sdist=$work/from-sdist
rm -rf "$from_sdist"
"$tools/bin/pip" wheel -q --no-deps --no-build-isolation -w "$from_sdist" "${sdists[0]}" ||
  fail "pip wheel $(basename "${sdists[0]}")"
built=("$from_sdist"/rdt-*-py3-none-linux_x86_64.whl)
[ -f "${built[0]}" ] || fail "the sdist built no py3-none-linux_x86_64 wheel: $(ls "$from_sdist")"
# Asked in Python, not through `zipfile -l | grep -q`: grep -q closes the pipe
# at its first match and pipefail then turns the lister's EPIPE into a failure.
"$tools/bin/python" -c 'import sys, zipfile; sys.exit("rdt/librdt.so" not in zipfile.ZipFile(sys.argv[1]).namelist())' "${built[0]}" ||
  fail "the wheel built from the sdist lacks rdt/librdt.so"
say "the sdist built $(basename "${built[0]}") with Go"
say "passed"
