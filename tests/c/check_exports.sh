#!/bin/sh
# librdt.so must export the rdt_* functions of rdt.h and nothing else (no Go
# runtime or cgo symbols, no internal helpers).
set -eu
lib=$1
header=$2
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort)
bad=$(printf '%s\n' "$exported" | grep -v '^rdt_[a-z]' || true)
if [ -n "$bad" ]; then
  echo "librdt.so exports symbols outside rdt_*:"
  printf '%s\n' "$bad"
  exit 1
fi
# Every function the header declares (RDT_API ... name(...)) is exported.
declared=$(grep -o '^RDT_API[^(]*(' "$header" | sed 's/RDT_API.*[ *]\([a-z_0-9]*\)($/\1/' | sort -u)
missing=$(printf '%s\n' "$declared" | while read -r f; do
  printf '%s\n' "$exported" | grep -qx "$f" || echo "$f"
done)
if [ -n "$missing" ]; then
  echo "declared in rdt.h but not exported:"
  printf '%s\n' "$missing"
  exit 1
fi
extra=$(printf '%s\n' "$exported" | while read -r f; do
  printf '%s\n' "$declared" | grep -qx "$f" || echo "$f"
done)
if [ -n "$extra" ]; then
  echo "exported but not declared in rdt.h:"
  printf '%s\n' "$extra"
  exit 1
fi
echo "librdt.so exports exactly the $(printf '%s\n' "$exported" | wc -l) functions of rdt.h"
