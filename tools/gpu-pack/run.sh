#!/usr/bin/env bash
# Usage: run.sh OUT
# rdt's GPU checks (docs/gpu.md), run from the pack this script sits in
# (`make gpu-pack` builds it) on a GPU machine without network access or Go,
# with that machine's own python3 and nothing installed. Every step runs under
# a time limit, and all of them within RDT_GPU_PACK_SECONDS (470 s, under 8
# minutes), so that no hang can use up the machine's time. A step whose
# prerequisite is missing, or whose GPU tests skipped for lack of a GPU, is
# "skipped" with the reason; where an NVIDIA GPU is found, RDT_REQUIRE_GPU
# defaults to 1 and such a skip is a failure instead.
# Writes into OUT: run.log (every step's output), steps/NAME.log,
# summary.json (the pack, the machine, and each step's status, reason, time
# and last lines; rewritten after every step), machine.json, gpu_bench.md
# and python-junit.xml. Exit status 0 when no step failed.
# Environment: GPU_PYTHON (default python3) runs the Python steps;
# RDT_CUDA_LIBRARY, RDT_FAKECUDA_DEVICES and RDT_NCCL_LIBRARY reach the tests
# unchanged (CI runs the pack on the test doubles of the CUDA driver and
# NCCL); without RDT_NCCL_LIBRARY, NCCL is the one of python3's nvidia-nccl
# wheel.
set -u

[ $# -eq 1 ] || { echo "usage: $0 OUT" >&2; exit 2; }
pack=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1/steps" || exit 2
out=$(cd "$1" && pwd)
runlog=$out/run.log
summary=$out/summary.json
rm -f "$out"/steps/*.log "$out"/{summary.json,machine.json,gpu_bench.md,python-junit.xml} # an earlier run's
: >"$runlog"
python=${GPU_PYTHON:-python3}
total=${RDT_GPU_PACK_SECONDS:-470}
deadline=$((SECONDS + total))
KILL_GRACE=5 # seconds between a step's SIGTERM and its SIGKILL
MIN_STEP=10  # a step is not started with less time than this left
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
t_start=$SECONDS
mode=""
work=$(mktemp -d "${TMPDIR:-/tmp}/rdt-gpu-pack.XXXXXX") || exit 2
finished=false
step_pid="" # the running step's timeout process
trap 'rm -rf "$work"' EXIT
trap 'stopped; exit 143' TERM INT HUP

note() { echo "$*" | tee -a "$runlog"; }

# ---- the JSON summary, written with bash alone (python3 may be missing) -----
# Output as valid UTF-8 (invalid bytes dropped), or ASCII without iconv.
clean() {
  if command -v iconv >/dev/null; then iconv -c -f UTF-8 -t UTF-8 2>/dev/null; else LC_ALL=C tr -cd '\11\12\15\40-\176'; fi
}
json_str() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\n'/\\n}
  printf '"%s"' "$(printf '%s' "$s" | LC_ALL=C tr -d '\000-\010\013-\037\177')"
}
json_lines() { # FILE: its last lines as a JSON array
  local line sep=""
  printf '['
  while IFS= read -r line; do
    printf '%s%s' "$sep" "$(json_str "$line")"
    sep=", "
  done < <(tail -n 25 "$1" 2>/dev/null | cut -c1-400 | clean)
  printf ']'
}
json_file() { # FILE: its JSON if it is a complete object, else why not
  if [ -s "$1" ] && [ "$(tail -c 2 "$1" | tr -d '\n')" = "}" ]; then cat "$1"; else json_str "not available: $2"; fi
}

names=() whats=() statuses=() reasons=() secs=() limits=() logs=() tests=()
write_summary() {
  local i n_failed=0 n_passed=0 n_skipped=0 tmp=$summary.tmp
  for i in "${!names[@]}"; do
    case ${statuses[$i]} in failed) n_failed=$((n_failed + 1)) ;; passed) n_passed=$((n_passed + 1)) ;; *) n_skipped=$((n_skipped + 1)) ;; esac
  done
  {
    printf '{\n "finished": %s,\n "ok": %s,\n' "$finished" "$([ $n_failed = 0 ] && echo true || echo false)"
    printf ' "passed": %d, "skipped": %d, "failed": %d,\n' $n_passed $n_skipped $n_failed
    printf ' "mode": %s,\n "require_gpu": %s,\n' "$(json_str "$mode")" "$([ "${RDT_REQUIRE_GPU:-}" = 1 ] && echo true || echo false)"
    printf ' "started": "%s", "seconds": %d, "budget_seconds": %d,\n' "$started" $((SECONDS - t_start)) "$total"
    printf ' "pack_bytes": %d,\n "pack": %s,\n' "$(du -sb "$pack" | cut -f1)" "$(json_file "$pack/pack.json" "no pack.json")"
    printf ' "machine": %s,\n "steps": [' "$(json_file "$out/machine.json" "the machine step did not finish")"
    for i in "${!names[@]}"; do
      printf '%s\n  {"name": %s, "checks": %s,\n   "status": "%s", "reason": %s, "tests": %s,\n   "seconds": %d, "limit_seconds": %d, "tail": %s}' \
        "$([ "$i" = 0 ] || echo ,)" "$(json_str "${names[$i]}")" "$(json_str "${whats[$i]}")" "${statuses[$i]}" \
        "$(json_str "${reasons[$i]}")" "$(json_str "${tests[$i]}")" "${secs[$i]}" "${limits[$i]}" "$(json_lines "${logs[$i]}")"
    done
    printf '\n ]\n}\n'
  } >"$tmp" && mv "$tmp" "$summary"
}

record() { # NAME WHAT STATUS REASON SECONDS LIMIT LOG
  names+=("$1") whats+=("$2") statuses+=("$3") reasons+=("$(printf '%s' "$4" | clean)") secs+=("$5") limits+=("$6") logs+=("$7")
  tests+=("$(tests_in "$7")")
  printf '%-12s %-7s %4ss  %s\n' "$1" "$3" "$5" "${4:-${tests[${#tests[@]} - 1]}}" | tee -a "$runlog"
  write_summary
}
skip() { # NAME WHAT REASON: a step not run because something it needs is missing
  if [ "${RDT_REQUIRE_GPU:-}" = 1 ] && [ "${SKIP_IS_FAILURE:-1}" = 1 ]; then
    record "$1" "$2" failed "$3 (RDT_REQUIRE_GPU=1)" 0 0 /dev/null
  else
    record "$1" "$2" skipped "$3" 0 0 /dev/null
  fi
}

# The distinct messages of the lines matching RE (at most three), without
# the test file and line they came from, each with how many tests gave it
# (pytest -rs counts them in brackets).
reasons_in() { # RE LOG
  grep -E "$1" "$2" | awk '{
    n = 1
    if (match($0, /^SKIPPED \[[0-9]+\] /)) { n = substr($0, 10, RLENGTH - 11) + 0; $0 = substr($0, RLENGTH + 1) }
    sub(/^ +/, ""); sub(/^[^ :]+\.(go|py):[0-9]+: /, "")
    if (!($0 in count)) order[++k] = $0
    count[$0] += n
  } END {
    for (i = 1; i <= k && i <= 3; i++)
      printf "%s%s%s", (i > 1 ? "; " : ""), order[i], (count[order[i]] > 1 ? " (" count[order[i]] " tests)" : "")
  }' | cut -c1-600
}
# How many tests passed, skipped and failed, from go test -v's or pytest's
# output (nothing for other commands).
tests_in() { # LOG
  if grep -q '^=== RUN' "$1"; then
    local p k f
    p=$(grep -cE '^ *--- PASS: ' "$1") k=$(grep -cE '^ *--- SKIP: ' "$1") f=$(grep -cE '^ *--- FAIL: ' "$1")
    echo "$p passed, $k skipped, $f failed (subtests included)"
  else
    grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|errors?|deselected)[^=]* in [0-9.]+s' "$1" | tail -n 1 | tr -d '='
  fi
}
# Why a command failed: the tests that failed, else its last line.
failure_in() { # LOG
  local failed
  failed=$(grep -E '^ *--- FAIL: |^FAILED |^ERROR ' "$1" | sed -E 's/^ *--- FAIL: ([^ ]+).*/\1/; s/^(FAILED|ERROR) //' |
    head -n 5 | paste -sd, - | sed 's/,/, /g')
  [ -n "$failed" ] && echo "failed: $failed" | cut -c1-600 || grep -v '^[[:space:]]*$' "$1" | tail -n 1 | cut -c1-400
}

# Runs COMMAND under the step's time limit (cut to what is left of the
# whole run) in STEP_DIR (default: the unpacked pack). Status: failed when it
# exits non-zero or times out, or its output matches FAIL_RE; skipped when
# its output matches SKIP_RE (tests that skipped for lack of a GPU); else
# passed.
run_step() { # NAME LIMIT WHAT SKIP_RE FAIL_RE COMMAND...
  local name=$1 limit=$2 what=$3 skip_re=$4 fail_re=$5
  shift 5
  local left=$((deadline - SECONDS - KILL_GRACE)) log=$out/steps/$name.log t0=$SECONDS rc status reason
  if [ $left -lt $MIN_STEP ]; then
    record "$name" "$what" skipped "no time left: run.sh keeps every step within ${total} s" 0 0 /dev/null
    return
  fi
  [ "$limit" -gt $left ] && limit=$left
  echo "==== $name: $what (limit ${limit} s): $*" >>"$runlog"
  # In the background, so that a signal to run.sh is handled at once (stopped).
  (cd "${STEP_DIR:-$work}" && exec timeout -k $KILL_GRACE "$limit" "$@") </dev/null >"$log" 2>&1 &
  step_pid=$! step=("$name" "$what" "$t0" "$limit" "$log")
  wait $step_pid
  rc=$?
  step_pid=""
  cat "$log" >>"$runlog"
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    status=failed reason="timed out after ${limit} s"
  elif [ $rc != 0 ]; then
    status=failed reason="exit status $rc: $(failure_in "$log")"
  elif [ -n "$fail_re" ] && grep -Eq "$fail_re" "$log"; then
    status=failed reason=$(reasons_in "$fail_re" "$log")
  elif [ -n "$skip_re" ] && grep -Eq "$skip_re" "$log"; then
    status=skipped reason=$(reasons_in "$skip_re" "$log")
    if [ "${RDT_REQUIRE_GPU:-}" = 1 ]; then status=failed reason="$reason (RDT_REQUIRE_GPU=1)"; fi
  else
    status=passed reason=""
  fi
  record "$name" "$what" $status "$reason" $((SECONDS - t0)) "$limit" "$log"
}

# When run.sh itself is stopped: the running step is stopped too (timeout
# passes the signal on) and recorded as failed, and the summary written.
stopped() {
  if [ -n "$step_pid" ]; then
    kill -TERM "$step_pid" 2>/dev/null
    cat "${step[4]}" >>"$runlog"
    record "${step[0]}" "${step[1]}" failed "run.sh was stopped by a signal during this step" \
      $((SECONDS - step[2])) "${step[3]}" "${step[4]}"
  fi
  write_summary
}

# ---- what this machine is -----------------------------------------------------
if nvidia-smi -L >/dev/null 2>&1 || compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  mode="gpu"
  export RDT_REQUIRE_GPU=${RDT_REQUIRE_GPU:-1}
elif [ -n "${RDT_CUDA_LIBRARY:-}" ]; then
  mode="cuda test double ($RDT_CUDA_LIBRARY)"
else
  mode="no CUDA (no NVIDIA device, RDT_CUDA_LIBRARY unset)"
fi
note "rdt GPU pack at $pack, output in $out; mode: $mode; RDT_REQUIRE_GPU=${RDT_REQUIRE_GPU:-}; budget ${total} s"
write_summary

# ---- unpack ---------------------------------------------------------------------
# Python's lzma stands in for a host without xz.
if command -v xz >/dev/null; then
  run_step unpack 60 "the payload unpacks" "" "" tar -xJf "$pack/payload.tar.xz" -C "$work"
else
  run_step unpack 60 "the payload unpacks (Python's tarfile: no xz here)" "" "" "$python" -c \
    'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$pack/payload.tar.xz" "$work"
fi
unpacked=true
[ "${statuses[0]}" = passed ] || unpacked=false

if command -v "$python" >/dev/null; then
  python_missing=""
else
  python_missing="no $python on PATH (GPU_PYTHON)"
fi
if [ -z "${RDT_NCCL_LIBRARY:-}" ] && [ -z "$python_missing" ] && $unpacked; then
  RDT_NCCL_LIBRARY=$(timeout 30 "$python" "$work/nccl-library.py" 2>/dev/null)
fi
if [ -n "${RDT_NCCL_LIBRARY:-}" ]; then export RDT_NCCL_LIBRARY; else unset RDT_NCCL_LIBRARY; fi
if [ -f "$work/nixl/FROM" ]; then
  nixl_missing=""
  export RDT_NIXL_LIBRARY=$work/nixl/.nixl_cu13.mesonpy.libs/libnixl_capi.so
  # UCX finds its modules next to libucs too; naming the folder keeps out a
  # system UCX's modules of another version.
  export UCX_MODULE_DIR=$work/nixl/nixl_cu13.libs/ucx
elif [ -f "$work/nixl/NOT-PACKED" ]; then
  nixl_missing="the pack holds no NIXL: $(cat "$work/nixl/NOT-PACKED")"
else
  nixl_missing="the pack was not unpacked"
fi
export PYTHONPATH=$work/python${PYTHONPATH:+:$PYTHONPATH} RDT_LIBRARY=$work/python/rdt/librdt.so PYTHONDONTWRITEBYTECODE=1

# ---- the steps --------------------------------------------------------------------
MACHINE_WHAT="the machine: GPU, driver, CUDA, NVLink and topology, torch, CuPy, NCCL, rdt's transports, the packed UCX"
CUDA_WHAT="the CUDA driver loader: devices, pointers, copies, IPC handles, events"
CUDA_IPC_WHAT="cuda_ipc: conformance suite and GPU tests, in one and two processes; the transport's own fetch time"
NCCL_WHAT="nccl: groups and transfers (more than one rank needs a GPU each)"
DOCTOR_WHAT="rdt doctor: every transport between two processes"
PY_WHAT="tests/python GPU tests: torch, CuPy and DLPack CUDA tensors through the Python API over cuda_ipc, nccl and nixl; deadlines, teardown"
BENCH_WHAT="bench/gpu_bench.py: cuda_ipc and nixl against a device-to-device copy, nixl's UCX lanes, across GPUs (into gpu_bench.md)"
NIXL_WHAT="nixl: conformance suite on host memory through the packed NIXL and UCX"
# What the tests print when they skip for lack of a GPU.
NO_CUDA_GO='^ +[^ ]+\.go:[0-9]+: no CUDA device: '
NO_NCCL_GO='^ +[^ ]+\.go:[0-9]+: no NCCL/CUDA: '
NO_GPU_PYTEST='^SKIPPED \[[0-9]+\] [^ ]+: (no CUDA device|no NCCL/CUDA|NIXL is not available)'

# Go's own deadline comes 10 s before the step's, so that a hung test
# prints every goroutine.
go_test() { # NAME LIMIT WHAT SKIP_RE FAIL_RE BINARY [ENV-ARGUMENTS...]
  local left=$((deadline - SECONDS - KILL_GRACE)) limit=$2
  [ "$limit" -gt $left ] && limit=$left
  STEP_DIR=$work/go run_step "$1" "$limit" "$3" "$4" "$5" env "${@:7}" \
    "$work/go/$6" -test.v -test.count=1 -test.timeout=$((limit > 20 ? limit - 10 : limit))s ${GO_TEST_FLAGS:-}
}
py_import() { # MODULES: why python3 cannot import them, or nothing
  local why
  why=$(timeout 60 "$python" -c "import $1" 2>&1) || echo "$python cannot import $1: $(echo "$why" | tail -n 1)"
}
torch_cuda_missing() { # why torch cannot reach a GPU, or nothing
  local why
  why=$(timeout 60 "$python" -c '
import torch
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} sees no CUDA device")' 2>&1) || why="torch is not importable: $(echo "$why" | tail -n 1)"
  echo "$why"
}

checks() {
  if [ -n "$python_missing" ]; then
    skip machine "$MACHINE_WHAT" "$python_missing"
  else
    run_step machine 60 "$MACHINE_WHAT" "" "" "$python" "$work/machine.py" "$out/machine.json"
  fi

  go_test go-cuda 60 "$CUDA_WHAT" "$NO_CUDA_GO" "" cuda.test
  # Its benchmark times the transport alone, to tell its share of a fetch
  # from the runtime's and Python's (bench below).
  GO_TEST_FLAGS="-test.bench=GPUFetch -test.benchtime=2000x" \
    go_test go-cuda_ipc 120 "$CUDA_IPC_WHAT" "$NO_CUDA_GO" "" cuda_ipc.test
  go_test go-nccl 120 "$NCCL_WHAT" "$NO_NCCL_GO" "" nccl.test

  # rdt's Python package needs numpy; the tests, pytest; the benchmark, torch.
  [ -n "$python_missing" ] || python_missing=$(py_import numpy)
  if [ -n "$python_missing" ]; then
    skip doctor "$DOCTOR_WHAT" "$python_missing"
    skip python "$PY_WHAT" "$python_missing"
    skip bench "$BENCH_WHAT" "$python_missing"
  else
    local require=cma,shm,tcp
    if [ "${RDT_REQUIRE_GPU:-}" = 1 ]; then
      require=$require,cuda_ipc,nccl
      [ -z "$nixl_missing" ] && require=$require,nixl
    fi
    run_step doctor 60 "$DOCTOR_WHAT (--require $require)" '^  cuda_ipc +(MISSING|LOADED) ' "" \
      "$python" -m rdt doctor --timeout 30 --require "$require"

    local missing
    missing=$(py_import pytest)
    if [ -n "$missing" ]; then
      skip python "$PY_WHAT" "$missing"
    else
      STEP_DIR=$work/python/tests run_step python 240 "$PY_WHAT" "$NO_GPU_PYTEST" "" \
        "$python" -m pytest -q -rfEs -p no:cacheprovider -W ignore::pytest.PytestUnknownMarkWarning \
        --junitxml="$out/python-junit.xml" test_gpu.py test_gpu_nccl.py test_gpu_nixl.py test_gpu_vmm.py
    fi

    missing=$(torch_cuda_missing)
    if [ -n "$missing" ]; then
      skip bench "$BENCH_WHAT" "$missing"
    else
      STEP_DIR=$work/python run_step bench 180 "$BENCH_WHAT" "" "" \
        env RDT_GPU_BENCH_LOGS="$out" bash -c 'set -o pipefail; "$0" bench/gpu_bench.py | tee "$1"' "$python" "$out/gpu_bench.md"
    fi
  fi

  if [ -n "$nixl_missing" ]; then
    SKIP_IS_FAILURE=0 skip go-nixl "$NIXL_WHAT" "$nixl_missing"
  else
    # The CUDA double stays away from UCX, which would be handed its fake
    # device pointers. The packed NIXL must load: a skip for its absence fails.
    go_test go-nixl 60 "$NIXL_WHAT" "" 'NIXL is not available' nixl.test -u RDT_CUDA_LIBRARY -u RDT_FAKECUDA_DEVICES
  fi
}

if $unpacked; then
  checks
else
  for s in machine go-cuda go-cuda_ipc go-nccl doctor python bench go-nixl; do
    SKIP_IS_FAILURE=0 skip $s "" "the pack was not unpacked"
  done
fi

finished=true
write_summary
failed=0
for s in "${statuses[@]}"; do [ "$s" = failed ] && failed=$((failed + 1)); done
note "rdt GPU pack: ${#names[@]} steps in $((SECONDS - t_start)) s, $failed failed; $summary"
[ $failed = 0 ]
