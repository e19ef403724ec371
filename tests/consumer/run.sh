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

echo "== C++ examples, CMake (find_package(rdt))"
cmake -S "$root/examples/cpp" -B "$tmp/cmake-cpp" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cmake-cpp.log" 2>&1 || {
  cat "$tmp/cmake-cpp.log"; exit 1; }
cmake --build "$tmp/cmake-cpp" >>"$tmp/cmake-cpp.log" 2>&1 || { cat "$tmp/cmake-cpp.log"; exit 1; }
"$tmp/cmake-cpp/producer_consumer"
"$tmp/cmake-cpp/custom_transport"

echo "== C++ examples, pkg-config"
mkdir -p "$tmp/pc-cpp" && cp "$root"/examples/cpp/*.cpp "$root/examples/cpp/Makefile" "$tmp/pc-cpp/"
make -s -C "$tmp/pc-cpp" >/dev/null
"$tmp/pc-cpp/producer_consumer"
"$tmp/pc-cpp/custom_transport"
echo "consumer test: ok"
