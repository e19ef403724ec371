#!/usr/bin/env bash
# Usage: bench-peers-libs.sh DIR
# Mooncake Transfer Engine's engine.so links libibverbs.so.1 even when it
# only speaks tcp. This unpacks Debian 12's libibverbs1 and the libnl
# libraries it needs into DIR (DIR/lib then holds the .so files, for
# LD_LIBRARY_PATH), touching nothing outside DIR: each pinned .deb comes from
# `apt-get download` or else from the Debian mirror, is checked against its
# SHA-256 and unpacked with dpkg-deb -x. When that cannot be done it writes
# why to DIR/why and still exits 0, so the benchmark reports the peer as not
# measured instead of stopping.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# package version pool-path sha256
debs="
libibverbs1 44.0-2 r/rdma-core 35054815259fee46173240254246d03b673a5cd5c528aaac96fd15ac428a8d59
libnl-3-200 3.7.0-0.2+b1 libn/libnl3 d1fc3e9eb8e79b4c96b0a64c3d8c9e068ae2f665cab71bd19f417ffd0453a890
libnl-route-3-200 3.7.0-0.2+b1 libn/libnl3 0fdcc425ae2982788c085c76a7cb0eda3e3db99d41bd1ce56082ee18e9f1e21f
"
rm -rf "$dir"
mkdir -p "$dir/debs" "$dir/root" "$dir/lib"
fail() { echo "$*" > "$dir/why"; echo "bench-peers-libs: $*" >&2; exit 0; }
echo "$debs" | while read -r pkg version pool sha; do
  [ -n "$pkg" ] || continue
  file="${pkg}_${version}_amd64.deb"
  (cd "$dir/debs" && apt-get download -q "$pkg=$version" >/dev/null 2>&1) ||
    curl -fsSL -o "$dir/debs/$file" "$mirror/pool/main/$pool/$file" ||
    wget -q -O "$dir/debs/$file" "$mirror/pool/main/$pool/$file" ||
    { echo "cannot download $file (apt-get download, $mirror)" > "$dir/why"; exit 1; }
  echo "$sha  $dir/debs/$file" | sha256sum -c --status ||
    { echo "$file does not have the pinned SHA-256" > "$dir/why"; exit 1; }
  dpkg-deb -x "$dir/debs/$file" "$dir/root" || { echo "dpkg-deb -x $file failed" > "$dir/why"; exit 1; }
done || fail "$(cat "$dir/why" 2>/dev/null)"
find "$dir/root" -name '*.so.*' \( -type f -o -type l \) -exec cp -P {} "$dir/lib/" \;
[ -e "$dir/lib/libibverbs.so.1" ] || fail "libibverbs.so.1 is not in the unpacked packages"
rm -rf "$dir/debs"
touch "$dir/.ready"
