#!/bin/sh
# librdt.so must export the rdt_* functions of rdt.h and nothing else (no Go
# runtime or cgo symbols, no internal helpers).
set -eu
lib=$1
header=$2
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort)
# fail_if LIST MESSAGE: fails with MESSAGE and the names in LIST, if any.
fail_if() {
  if [ -n "$1" ]; then
    echo "$2:"
    printf '%s\n' "$1"
    exit 1
  fi
}
# absent LIST FROM: the names of LIST that are not in FROM.
absent() {
  printf '%s\n' "$1" | while read -r f; do
    printf '%s\n' "$2" | grep -qx "$f" || echo "$f"
  done
}
fail_if "$(printf '%s\n' "$exported" | grep -v '^rdt_[a-z]' || true)" "librdt.so exports symbols outside rdt_*"
# Every function the header declares (RDT_API ... name(...)) is exported.
declared=$(grep -o '^RDT_API[^(]*(' "$header" | sed 's/RDT_API.*[ *]\([a-z_0-9]*\)($/\1/' | sort -u)
fail_if "$(absent "$declared" "$exported")" "declared in rdt.h but not exported"
fail_if "$(absent "$exported" "$declared")" "exported but not declared in rdt.h"
echo "librdt.so exports exactly the $(printf '%s\n' "$exported" | wc -l) functions of rdt.h"
