#!/usr/bin/env bash
# Usage: fuzz.sh [FUZZTIME]
# A short coverage-guided run (FUZZTIME each, default 10s) of every fuzz
# target in the module, as `go test -list` finds them, so a new target runs
# without being listed anywhere. The seed corpora live in testdata/fuzz and
# also run as plain tests under `go test`.
set -euo pipefail
fuzztime=${1:-10s}
go=${GO:-go}
cd "$(dirname "$0")/.."
# go test -list prints a package's matching names, then "ok <package> ...".
targets=$("$go" test -list '^Fuzz' ./... |
  awk '/^Fuzz/ { names[n++] = $1; next } /^ok/ { for (i = 0; i < n; i++) print $2, names[i]; n = 0 }')
[ -n "$targets" ] || { echo "fuzz: go test -list found no fuzz targets" >&2; exit 1; }
while read -r pkg target; do
  echo "== $pkg $target"
  "$go" test "$pkg" -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime"
done <<<"$targets"
