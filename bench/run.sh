#!/usr/bin/env bash
# Usage: bench/run.sh RDTBENCH VENV RESULTS.md    (what `make bench` runs)
# Measures the transports against this machine's own limits with the C
# benchmark RDTBENCH (bench/rdtbench.c), then the Python binding against the
# C ABI in the same run (bench/python_bench.py, with rdt installed from
# bindings/python into the virtualenv VENV), and writes both, with links to
# the other benchmarks' results, to RESULTS.md: one page, every table from
# this run, the machine and the date at its top, and the spread of the
# rows that move most over three runs quiet and three beside busy cores
# (bench/spread.py). The file is replaced only
# when every step succeeded. RDT_NIXL_LIBRARY, when set, is passed on (the
# nixl rows).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 RDTBENCH VENV RESULTS.md" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$1" ] || { echo "bench: $1 is not the built benchmark (make build/rdtbench)" >&2; exit 2; }
[ -x "$2/bin/python" ] || { echo "bench: $2 is not a virtualenv (make build/venv/.ready)" >&2; exit 2; }
rdtbench=$(realpath "$1")
venv=$(realpath "$2")
out=$(realpath "$3")
cd "$root" # rdtbench runs bench/pickle_pipe.py from here
tmp=$(mktemp "$out.XXXXXX")
trap 'rm -f "$tmp"' EXIT

# The C benchmark; its pickle baseline runs in the virtualenv's Python.
PYTHON=$venv/bin/python "$rdtbench" bench "$tmp"

# The Python binding as it is in this tree, then its figures against the C
# ABI's, measured in one run.
"$venv/bin/pip" install -q --no-deps --force-reinstall ./bindings/python
"$venv/bin/python" bench/python_bench.py "$rdtbench" >>"$tmp"
# The rows that move most, three runs quiet and three beside busy cores.
"$venv/bin/python" bench/spread.py "$rdtbench" >>"$tmp"

cat >>"$tmp" <<'LINKS'

## The other pages

Each is written whole by its own target, in one run, with its date:

- rdt on a GPU (the GPU pack's latest run on hardware): [GPU.md](GPU.md).
- rdt against Mooncake Transfer Engine, NIXL, gloo, shared memory and pickle: [PEERS.md](PEERS.md) (`make bench-peers`).
- rdt inside Ray, against Ray's own transports: [RAY_RESULTS.md](RAY_RESULTS.md) (`make bench-ray`).
- Weight sync across hosts against Ray's object store and gloo: [SYNC.md](SYNC.md) (`make bench-sync`).
- Weight sync into vLLM against its RPC and a /dev/shm checkpoint: [VLLM.md](VLLM.md) (`make bench-vllm`).

Earlier runs of this page are in its history (`git log -p bench/RESULTS.md`).
LINKS
chmod 644 "$tmp"
mv "$tmp" "$out"
trap - EXIT
