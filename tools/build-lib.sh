#!/bin/sh
# Usage: build-lib.sh OUTPUT [GO-BUILD-FLAGS...]
# Builds librdt.so (the capi package, -buildmode=c-shared) at OUTPUT: the
# one recipe that the Makefile, CMakeLists.txt and the Python package's
# setup.py all run. Extra flags (-race, -tags ..., -v) go to `go build`
# before the package; GO names the go binary (default: go on PATH).
# The version script keeps every symbol but rdt_* local, and the soname is
# what consumers link against. cgo's generated header is removed: the
# interface is include/rdt.h.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 OUTPUT [GO-BUILD-FLAGS...]" >&2; exit 2; }
out=$1
shift
case $out in
/*) ;;
*) out=$(pwd)/$out ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$(dirname "$out")"
cd "$root"
CGO_ENABLED=1 "${GO:-go}" build -buildmode=c-shared -trimpath \
  "-ldflags=-extldflags=-Wl,--version-script=$root/capi/exports.map,-soname,librdt.so" \
  "$@" -o "$out" ./capi
rm -f "${out%.so}.h"
