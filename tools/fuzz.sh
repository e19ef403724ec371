#!/usr/bin/env bash
# Usage: fuzz.sh [FUZZTIME] [TARGET...]
# A short coverage-guided run (FUZZTIME each, default 10s) of the named
# fuzz targets, or of every fuzz target in the module when none is named,
# as `go test -list` finds them, so a new target runs without being listed
# anywhere; a named target that is not found is an error. The seed corpora
# live in testdata/fuzz and also run as plain tests under `go test`.
set -euo pipefail
fuzztime=${1:-10s}
shift || true
go=${GO:-go}
cd "$(dirname "$0")/.."
# Only the packages whose tests declare a fuzz target are listed: listing
# every package would build every test binary first.
pkgs=$(grep -rlE --include='*_test.go' --exclude-dir=build --exclude-dir=.git '^func Fuzz' . | xargs -n1 dirname | sort -u)
# go test -list prints a package's matching names, then "ok <package> ...".
found=$("$go" test -list '^Fuzz' $pkgs |
  awk '/^Fuzz/ { names[n++] = $1; next } /^ok/ { for (i = 0; i < n; i++) print $2, names[i]; n = 0 }')
[ -n "$found" ] || { echo "fuzz: go test -list found no fuzz targets" >&2; exit 1; }
targets=$found
if [ $# -gt 0 ]; then
  targets=$(awk -v want="$*" 'BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) named[w[i]] = 1 }
    $2 in named { print; seen[$2] = 1 }
    END { for (t in named) if (!(t in seen)) { print "fuzz: no fuzz target " t " in the module" > "/dev/stderr"; bad = 1 }; exit bad }' <<<"$found")
fi
while read -r pkg target; do
  echo "== $pkg $target"
  "$go" test "$pkg" -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime"
done <<<"$targets"
