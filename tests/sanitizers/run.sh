#!/usr/bin/env bash
# The C and C++ suites again, built with AddressSanitizer and
# UndefinedBehaviorSanitizer in BUILD_DIR (see docs/cpp.md, "Sanitizers",
# for the one LeakSanitizer suppression, generated for the exact
# allocation). CMAKE names cmake (default cmake).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cmake=${CMAKE:-cmake}
mkdir -p "$1"
dir=$(cd "$1" && pwd)
"$cmake" -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DRDT_BUILD_TESTS=ON -DRDT_SANITIZE=ON >/dev/null
"$cmake" --build "$dir" -j2
"$here/lsan-supp.sh" "$dir/librdt.so" "$dir/lsan.supp"
cd "$dir"
LSAN_OPTIONS=suppressions=$dir/lsan.supp:print_suppressions=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j2
