# Sourced (by build-wheels.sh and gpu-pack.sh) from the repository root:
# makes build/wheel-tools, the pinned tools of tools/requirements-wheels.txt
# (zig among them), once per version of that file, with PYTHON (default
# python3), and exports what tools/zig-cc.sh needs, zig's cache in
# build/zig-cache. Sets zig_tools to that virtualenv.
zig_tools=$PWD/build/wheel-tools
zig_stamp=$zig_tools/.ready-$(sha256sum tools/requirements-wheels.txt | cut -c1-16)
if [ ! -f "$zig_stamp" ]; then
  rm -rf "$zig_tools"
  "${PYTHON:-python3}" -m venv "$zig_tools"
  "$zig_tools/bin/pip" install -q -r tools/requirements-wheels.txt
  touch "$zig_stamp"
fi
export ZIG_PYTHON="$zig_tools/bin/python"
export ZIG_GLOBAL_CACHE_DIR="$PWD/build/zig-cache" ZIG_LOCAL_CACHE_DIR="$PWD/build/zig-cache"
