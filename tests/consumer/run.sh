#!/usr/bin/env bash
# Installs rdt into a temporary prefix, then builds and runs the examples as
# a user would: as separate projects, with CMake's find_package(rdt) and with
# pkg-config.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

make -C "$root" --no-print-directory install PREFIX="$prefix" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log"; exit 1; }
echo "installed into a temporary prefix:"
(cd "$prefix" && find . -type f | sort | sed 's/^/  /')

echo "== CMake consumer (find_package(rdt))"
cmake -S "$root/examples/c" -B "$tmp/cmake-c" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cmake.log" 2>&1 || {
  cat "$tmp/cmake.log"; exit 1; }
cmake --build "$tmp/cmake-c" >>"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; exit 1; }
"$tmp/cmake-c/hello"

echo "== pkg-config consumer"
pcdir=$(dirname "$(find "$prefix" -name rdt.pc | head -n1)")
export PKG_CONFIG_PATH=$pcdir
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/hello-pc" "$root/examples/c/hello.c" $(pkg-config --cflags --libs rdt)
"$tmp/hello-pc"
echo "consumer test: ok"
