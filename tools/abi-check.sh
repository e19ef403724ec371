#!/bin/sh
# The ABI check: librdt.so's public interface (the functions rdt.h declares
# and every type they reach) against the committed baseline abi/librdt.abi,
# with libabigail's abidw and abidiff. An incompatible change fails; see
# docs/abi.md, "Keeping the ABI stable".
#
#   tools/abi-check.sh [LIBRARY]            check (default build/librdt.so)
#   tools/abi-check.sh --update [LIBRARY]   write the baseline from LIBRARY
#
# libabigail comes from Debian's abigail-tools, pinned below, downloaded and
# unpacked into build/abigail without root (with whichever of its libraries
# this machine lacks). Only where Debian's repository cannot be reached does
# the check skip, saying so; RDT_REQUIRE_ABI_CHECK=1 makes that a failure.
set -eu

ABIGAIL_VERSION=2.2-2
# For the direct download, used where apt-get has no package lists.
ABIGAIL_POOL=https://deb.debian.org/debian/pool/main/liba/libabigail
ABIGAIL_TOOLS_SHA256_AMD64=4f3aeb8bc0830905b7b7a206fbebea7670a30ea28f3afbd93f013a590897e1c1
LIBABIGAIL0_SHA256_AMD64=4885c20b8a0d5a34a963aeaea37a253a2f477ff375bc5902105a7d498bdf202b

root=$(cd "$(dirname "$0")/.." && pwd)
update=0
if [ "${1:-}" = --update ]; then
  update=1
  shift
fi
lib=${1:-$root/build/librdt.so}
header=$root/include/rdt.h
baseline=$root/abi/librdt.abi
work=$root/build/abi
abigail=$root/build/abigail

skip() {
  echo "abi-check: SKIPPED: $*" >&2
  if [ "${RDT_REQUIRE_ABI_CHECK:-0}" = 1 ]; then
    echo "abi-check: RDT_REQUIRE_ABI_CHECK=1, so this is a failure" >&2
    exit 1
  fi
  exit 0
}

# ---- libabigail, pinned, unpacked into build/abigail ---------------------

fetch_pinned_deb() { # package sha256-for-amd64
  if apt-get download "$1=$ABIGAIL_VERSION" >/dev/null 2>&1; then
    return 0 # apt checked it against the signed repository index
  fi
  [ "$(dpkg --print-architecture)" = amd64 ] || return 1
  file=${1}_${ABIGAIL_VERSION}_amd64.deb
  curl -fsSL --retry 2 -o "$file" "$ABIGAIL_POOL/$file" || return 1
  echo "$2  $file" | sha256sum -c --quiet - || { echo "abi-check: $file does not match its pinned sha256" >&2; exit 1; }
}

installed() { # package
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# The packages a .deb depends on (first alternative, versions dropped).
depends() { # deb
  { dpkg-deb -f "$1" Pre-Depends; dpkg-deb -f "$1" Depends; } | tr ',' '\n' | sed 's/|.*//; s/(.*)//; s/:any//; s/^ *//; s/ *$//' |
    grep -v '^$' || true
}

install_abigail() {
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
    skip "abigail-tools comes from Debian's repository, and this machine has no apt-get/dpkg-deb to reach it"
  rm -rf "$abigail"
  mkdir -p "$abigail/debs"
  cd "$abigail/debs"
  for pkg in "abigail-tools $ABIGAIL_TOOLS_SHA256_AMD64" "libabigail0 $LIBABIGAIL0_SHA256_AMD64"; do
    # shellcheck disable=SC2086
    fetch_pinned_deb $pkg || skip "Debian's repository cannot be reached to download ${pkg% *} $ABIGAIL_VERSION"
  done
  # Their libraries, and those libraries' own, where this machine lacks them.
  seen=" abigail-tools libabigail0 "
  queue=$(for d in ./*.deb; do depends "$d"; done)
  while [ -n "$queue" ]; do
    next=""
    for pkg in $queue; do
      case $seen in *" $pkg "*) continue ;; esac
      seen="$seen$pkg "
      installed "$pkg" && continue
      apt-get download "$pkg" >/dev/null 2>&1 ||
        skip "Debian's repository cannot be reached to download $pkg, which abigail-tools needs"
      next="$next $(depends ./"$pkg"_*.deb)"
    done
    queue=$next
  done
  for d in ./*.deb; do dpkg-deb -x "$d" "$abigail/root"; done
  cd "$root"
  abigail_run abidw --version >/dev/null || {
    echo "abi-check: the unpacked abidw does not run:" >&2
    abigail_run abidw --version >&2 || true
    exit 1
  }
  touch "$abigail/.ready-$ABIGAIL_VERSION"
}

abigail_run() { # tool args...
  tool=$1
  shift
  LD_LIBRARY_PATH="$abigail/root/usr/lib/$(uname -m)-linux-gnu:$abigail/root/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$abigail/root/usr/bin/$tool" "$@"
}

[ -f "$abigail/.ready-$ABIGAIL_VERSION" ] || install_abigail

# ---- the current library's ABI -------------------------------------------

[ -f "$lib" ] || { echo "abi-check: $lib does not exist; build it first (make build/librdt.so)" >&2; exit 1; }
mkdir -p "$work"

# The public interface is what rdt.h declares: every other symbol is left
# out of the dump (the version script already hides all but rdt_*).
declared=$(grep -o '^RDT_API[^(]*(' "$header" | sed 's/.*[ *]\([a-z_0-9]*\)($/\1/' | sort -u | paste -sd'|' -)
cat >"$work/public.suppr" <<EOF
[suppress_function]
  symbol_name_not_regexp = ^($declared)\$
  drop = yes
[suppress_variable]
  symbol_name_not_regexp = ^($declared)\$
  drop = yes
EOF

current=$work/librdt.abi
abigail_run abidw --no-corpus-path --no-comp-dir-path --no-show-locs --no-elf-needed --type-id-style hash \
  --exported-interfaces-only --drop-private-types --headers-dir "$root/include" \
  --suppressions "$work/public.suppr" --out-file "$current" "$lib"

# Types renamed in rdt.h keep their old name as a deprecated typedef of the
# new one ("typedef NEW OLD RDT_DEPRECATED(...)": rdt.h, "Renamed names").
# A C program's binary depends on a type's layout, never on its name, so
# the baseline is compared under the new names: its typedefs and struct
# tags called OLD are read as NEW (a struct's tag is its typedef's name),
# and a renamed type whose layout is unchanged is no change at all. A
# baseline that already uses the new names is left as it is.
renames=$(sed -n 's/^typedef \([a-z_0-9]*\) \([a-z_0-9]*\) RDT_DEPRECATED(.*/\2 \1/p' "$header")
compared=$work/baseline.abi
if [ -f "$baseline" ]; then
  script=$(printf '%s\n' "$renames" | awk 'NF == 2 { printf "s/ name=\x27%s\x27/ name=\x27%s\x27/g;", $1, $2 }')
  sed "$script" "$baseline" >"$compared"
fi

header_major() { sed -n 's/^#define RDT_VERSION_MAJOR \([0-9]*\).*/\1/p' "$header"; }
baseline_major() { sed -n '2s/^  <!-- rdt ABI baseline, RDT_VERSION_MAJOR \([0-9]*\)[^0-9].*/\1/p' "$baseline"; }

# A struct's data members in an abidw dump, one "offset name type-id" a line.
members() { # dump struct
  awk -v q="'" -v want="$2" '
    index($0, "<class-decl name=" q want q) && !index($0, "is-declaration-only") { inside = 1; next }
    inside && index($0, "</class-decl>") { exit }
    inside && match($0, "layout-offset-in-bits=" q "[0-9]+") { offset = substr($0, RSTART + 23, RLENGTH - 23) }
    inside && index($0, "<var-decl ") {
      match($0, "name=" q "[^" q "]*"); name = substr($0, RSTART + 6, RLENGTH - 6)
      match($0, "type-id=" q "[^" q "]*"); type = substr($0, RSTART + 9, RLENGTH - 9)
      print offset, name, type
    }' "$1"
}

# Versioned structs (those that begin with struct_size) may grow at the end:
# the library reads and writes only the caller's struct_size bytes. Those
# whose baseline members are, unchanged, the first members now are left out
# of the comparison (libabigail's own "inserted at end" rule would also hide
# a change made together with an appended field).
versioned=$(awk '/^typedef struct [a-z_0-9]+ \{/ { name = $3; getline; if ($0 ~ /^ *uint32_t struct_size;/) print name }' "$header")
grown=""
for s in $([ -f "$baseline" ] && echo "$versioned"); do
  members "$compared" "$s" >"$work/before.members"
  members "$current" "$s" >"$work/after.members"
  [ -s "$work/before.members" ] || continue
  cmp -s "$work/before.members" "$work/after.members" && continue
  if head -n "$(wc -l <"$work/before.members")" "$work/after.members" | cmp -s - "$work/before.members"; then
    grown="$grown${grown:+|}$s"
  fi
done
if [ -n "$grown" ]; then
  printf '[suppress_type]\n  type_kind = struct\n  name_regexp = ^(%s)$\n' "$grown" >"$work/grown.suppr"
else
  : >"$work/grown.suppr"
fi

# abidiff's exit status is a bit set: 1 error, 2 usage, 4 change, 8 incompatible change.
compare() {
  set +e
  abigail_run abidiff --no-show-locs --suppressions "$work/grown.suppr" "$compared" "$current" \
    >"$work/abidiff.txt" 2>"$work/abidiff.err"
  diff_status=$?
  set -e
  # A file it cannot parse is reported on stderr, yet may leave the status 0.
  if [ $((diff_status & 3)) -ne 0 ] || [ -s "$work/abidiff.err" ]; then
    cat "$work/abidiff.txt" "$work/abidiff.err" >&2
    echo "abi-check: abidiff failed (exit status $diff_status)" >&2
    exit 1
  fi
}

# Whether the difference is more than additions. abidiff flags only some
# breaks as incompatible (a removed function); others, such as a parameter
# whose type changed, are "changed". Both need a major version.
breaking() {
  [ $((diff_status & 8)) -ne 0 ] ||
    grep -Eq 'changes summary: .*([1-9][0-9]* Removed|[1-9][0-9]* Changed)' "$work/abidiff.txt"
}

if [ "$update" = 1 ]; then
  if [ -f "$baseline" ]; then
    compare
    recorded_major=$(baseline_major)
    if breaking && { [ -z "$recorded_major" ] || [ "$(header_major)" -le "$recorded_major" ]; }; then
      cat "$work/abidiff.txt" >&2
      echo "abi-check: refusing to record a changed or removed interface as the baseline of the same major version" \
        "($(header_major)): bump RDT_VERSION_MAJOR first (see docs/abi.md, \"Keeping the ABI stable\")" >&2
      exit 1
    fi
  fi
  mkdir -p "$(dirname "$baseline")"
  # abidiff wants the root element first: the note goes right after it
  # (an XML comment, so no double hyphens).
  sed "1a\\  <!-- rdt ABI baseline, RDT_VERSION_MAJOR $(header_major), made by tools/abi-check.sh with libabigail $ABIGAIL_VERSION -->" \
    "$current" >"$baseline"
  echo "abi-check: wrote $baseline"
  exit 0
fi

[ -f "$baseline" ] || { echo "abi-check: no baseline at $baseline; create it with tools/abi-check.sh --update" >&2; exit 1; }
compare
if [ "$diff_status" -eq 0 ]; then
  echo "abi-check: $(basename "$lib") matches the ABI baseline abi/librdt.abi"
  exit 0
fi
cat "$work/abidiff.txt" >&2
if breaking; then
  cat >&2 <<EOF
abi-check: FAILED: the change above breaks the ABI of librdt.so against abi/librdt.abi.
  Programs built against the previous rdt.h would break. Make the change compatible
  (new functions, new fields at the end of a struct that begins with struct_size),
  or, if the break is intended, release it as a new major version:
    1. bump RDT_VERSION_MAJOR in include/rdt.h (and the version in CMakeLists.txt,
       bindings/python/pyproject.toml and bindings/python/rdt/__init__.py), and
       RDT_ABI_VERSION there too if a struct's layout changed;
    2. run: make build/librdt.so && tools/abi-check.sh --update
    3. commit abi/librdt.abi together with the change.
EOF
else
  cat >&2 <<EOF
abi-check: FAILED: the interface grew (above), which is compatible; record it in the
  baseline so that later changes are checked against it (no version bump needed):
    make build/librdt.so && tools/abi-check.sh --update, then commit abi/librdt.abi.
EOF
fi
exit 1
