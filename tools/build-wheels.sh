#!/bin/sh
# Usage: build-wheels.sh [DIST]   (DIST defaults to dist/)
# Builds the manylinux wheels (x86_64 and aarch64) and the sdist into DIST.
# librdt.so is built by tools/build-lib.sh, the one recipe, with zig as
# cgo's C compiler (tools/zig-cc.sh) targeting glibc $GLIBC, so it needs no
# newer glibc symbol and no libgcc_s; setup.py packs it (RDT_PREBUILT_LIBRARY)
# under the manylinux tag (RDT_WHEEL_PLATFORM). The pinned tools
# (tools/requirements-wheels.txt) live in build/wheel-tools, zig's cache in
# build/zig-cache (tools/zig-env.sh). See docs/packaging.md.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dist=${1:-dist}
mkdir -p "$dist"
dist=$(cd "$dist" && pwd)

# glibc 2.17 is manylinux2014's; the library uses nothing newer (checked
# below), so the wheels install on every distribution pip calls manylinux.
GLIBC=2.17
ARCHES="x86_64 aarch64"

. tools/zig-env.sh
tools=$zig_tools

# The built library against the manylinux rules auditwheel checks too: its
# soname, no libgcc_s, no glibc symbol newer than $GLIBC.
check_library() { # lib
  readelf -d "$1" | grep -q 'Library soname: \[librdt.so\]' ||
    { echo "build-wheels: $1 lacks the soname librdt.so" >&2; exit 1; }
  if readelf -d "$1" | grep NEEDED | grep -q libgcc_s; then
    echo "build-wheels: $1 needs libgcc_s" >&2
    exit 1
  fi
  # A symbol that no needed library provides fails dlopen(RTLD_NOW), which
  # ctypes uses (cgosymbolizer's _Unwind_* calls, hence -lunwind below).
  unbound=$(readelf --dyn-syms -W "$1" | awk '$7 == "UND" && $8 != "" && $8 !~ /@/ && $5 != "WEAK" { print $8 }')
  [ -z "$unbound" ] || { echo "build-wheels: $1 leaves symbols no library provides:" $unbound >&2; exit 1; }
  newest=$(readelf -V -W "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
  if [ "$(printf '%s\n%s\n' "$newest" "$GLIBC" | sort -V | tail -n 1)" != "$GLIBC" ]; then
    echo "build-wheels: $1 needs GLIBC_$newest, newer than the wheels' glibc $GLIBC" >&2
    exit 1
  fi
  echo "build-wheels: $1: soname librdt.so, no libgcc_s, no unbound symbol, newest glibc symbol GLIBC_$newest"
}

# Runs a command with its output in LOG, shown only if it fails.
quietly() { # log command...
  log=$1
  shift
  mkdir -p "$(dirname "$log")"
  "$@" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
}

rm -f "$dist"/rdt-*.whl "$dist"/rdt-*.tar.gz
tag=manylinux_$(echo "$GLIBC" | tr . _)
for arch in $ARCHES; do
  case $arch in
  x86_64) goarch=amd64 ;;
  aarch64) goarch=arm64 ;;
  esac
  lib=$root/build/wheels/$arch/librdt.so
  # zig links no unwinder by itself: its static libunwind, hidden by the
  # version script, serves the traceback instead of libgcc_s.
  CC="$root/tools/zig-cc.sh $arch-linux-gnu.$GLIBC" CGO_LDFLAGS="${CGO_LDFLAGS:-} -lunwind" GOARCH=$goarch GOOS=linux \
    tools/build-lib.sh "$lib"
  check_library "$lib"
  rm -rf bindings/python/build
  # manylinux2014 is the legacy name of manylinux_2_17, for pip before 20.3.
  RDT_PREBUILT_LIBRARY=$lib RDT_WHEEL_PLATFORM=${tag}_$arch.manylinux2014_$arch \
    quietly "$root/build/wheels/$arch/build.log" "$tools/bin/python" -m build --no-isolation --wheel --outdir "$dist" bindings/python
done
rm -rf bindings/python/build
quietly "$root/build/wheels/sdist.log" "$tools/bin/python" -m build --no-isolation --sdist --outdir "$dist" bindings/python
ls -1 "$dist"/rdt-*
