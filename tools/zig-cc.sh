#!/bin/sh
# Usage (as CC): zig-cc.sh TARGET [CC-ARGS...], e.g. TARGET x86_64-linux-gnu.2.17
# cgo's C compiler for the manylinux wheels: zig (PyPI's ziglang, run by the
# Python in ZIG_PYTHON) links against that glibc version's symbols and needs
# no libgcc_s. The target is part of CC itself (CC="zig-cc.sh TARGET") so
# that Go's build cache, keyed on CC, tells the targets apart.
set -eu
target=$1
shift
exec "${ZIG_PYTHON:?}" -m ziglang cc -target "$target" "$@"
