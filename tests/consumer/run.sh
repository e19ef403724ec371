#!/usr/bin/env bash
# The consumer test: installs rdt into a temporary prefix, then builds and
# runs the C and C++ examples as a user would, as projects of their own:
# with CMake's find_package(rdt) and with pkg-config. Nothing here sees the
# source tree's headers or build directory, only the installed package.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
log=$tmp/log

# Runs a command quietly; shows its output only when it fails.
quiet() { "$@" >"$log" 2>&1 || { cat "$log"; echo "consumer test: failed: $*" >&2; exit 1; }; }

# A producer | consumer pipeline of the C++ examples, checked.
pipeline() {
  "$1/producer" | "$1/consumer" | tee "$tmp/out"
  grep -q "all values match" "$tmp/out"
}

# The C example must print the fetched values.
hello() {
  "$1" | tee "$tmp/out"
  grep -qx "RDT_OK: 1 2 3 4" "$tmp/out"
}

quiet make -C "$root" --no-print-directory install PREFIX="$prefix"
echo "installed into a temporary prefix:"
(cd "$prefix" && find . -type f | sort | sed 's/^/  /')
pcdir=$(dirname "$(find "$prefix" -name rdt.pc | head -n1)")

# The CMake project builds the demo too (examples/c/demo.c); make demo runs it.
echo "== C example, CMake (find_package(rdt), rdt::rdt)"
quiet cmake -S "$root/examples/c" -B "$tmp/c-cmake" -DCMAKE_PREFIX_PATH="$prefix"
quiet cmake --build "$tmp/c-cmake"
hello "$tmp/c-cmake/hello"

echo "== C example, pkg-config"
quiet env PKG_CONFIG_PATH="$pcdir" sh -c \
  "cc -std=c11 -Wall -Wextra -Werror -o '$tmp/hello-pc' '$root/examples/c/hello.c' \$(pkg-config --cflags --libs rdt)"
hello "$tmp/hello-pc"

echo "== C++ examples, CMake (find_package(rdt), rdt::cpp)"
quiet cmake -S "$root/examples/cpp" -B "$tmp/cpp-cmake" -DCMAKE_PREFIX_PATH="$prefix"
quiet cmake --build "$tmp/cpp-cmake" -j2
pipeline "$tmp/cpp-cmake"
"$tmp/cpp-cmake/custom_transport"

echo "== C++ examples, pkg-config (examples/cpp/Makefile)"
mkdir -p "$tmp/cpp-pc"
cp "$root"/examples/cpp/*.cpp "$root/examples/cpp/Makefile" "$tmp/cpp-pc/"
quiet env PKG_CONFIG_PATH="$pcdir" make -C "$tmp/cpp-pc" -j2 CXXFLAGS="-O2 -Wall -Wextra -Werror"
pipeline "$tmp/cpp-pc"
"$tmp/cpp-pc/custom_transport"
echo "consumer test: ok"
