"""Usage: check_summary.py doubles|no-cuda|no-time OUT
Checks OUT/summary.json, written by the GPU pack's run.sh on a machine
without a GPU (tests/gpu-pack/run.sh), against what that run must report.
Exits 1 naming every difference."""

import json
import os
import re
import sys

CARRY_LIMIT = 64 << 20
STEPS = ["unpack", "machine", "go-cuda", "go-cuda_ipc", "go-nccl", "doctor", "python", "bench", "go-nixl"]
GO_ON_DOUBLES = ["go-cuda", "go-cuda_ipc", "go-nccl"]
# What machine.py reports (docs/gpu.md, "Reading summary.json").
MACHINE_FACTS = ["host", "gpu", "nvlink", "topology", "cuda_driver", "torch", "cupy", "nccl", "rdt", "nixl", "ucx"]
# What a step skipped for lack of a GPU gives as its reason, by run.
NO_GPU = {
    "doubles": {"doctor": "cuda_ipc", "python": "no CUDA device", "bench": "torch"},
    "no-cuda": {"go-cuda": "no CUDA device", "go-cuda_ipc": "no CUDA device", "go-nccl": "no NCCL/CUDA",
                "doctor": "cuda_ipc", "python": "no CUDA device", "bench": "torch"},
}


def check(expect, out):
    problems = []
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    steps = {s["name"]: s for s in summary["steps"]}
    if [s["name"] for s in summary["steps"]] != STEPS:
        problems.append(f"steps {[s['name'] for s in summary['steps']]}, expected {STEPS}")
    if not summary["finished"] or not summary["ok"] or summary["failed"]:
        problems.append(f"finished {summary['finished']}, ok {summary['ok']}, {summary['failed']} failed")
    if summary["require_gpu"]:
        problems.append("RDT_REQUIRE_GPU=1 on a machine without a GPU")
    if summary["pack_bytes"] > CARRY_LIMIT:
        problems.append(f"the pack is {summary['pack_bytes']} bytes, over {CARRY_LIMIT}")
    if summary["seconds"] > summary["budget_seconds"] + 15:
        problems.append(f"the run took {summary['seconds']} s of a {summary['budget_seconds']} s budget")
    for s in summary["steps"]:
        if s["status"] not in ("passed", "skipped"):
            problems.append(f"{s['name']}: {s['status']}: {s['reason']}")
        if s["status"] == "skipped" and not s["reason"]:
            problems.append(f"{s['name']}: skipped without a reason")
        if s["seconds"] > s["limit_seconds"] + 6:
            problems.append(f"{s['name']}: ran {s['seconds']} s past its {s['limit_seconds']} s limit")
    has_nixl = not str(summary["pack"]["nixl"]).startswith("not packed")

    def want(name, status, reason=None):
        s = steps.get(name)
        if s is None:
            return
        if s["status"] != status or (reason and reason not in s["reason"]):
            problems.append(f"{name}: {s['status']} ({s['reason']!r}), expected {status}"
                            + (f" with a reason naming {reason!r}" if reason else ""))

    if expect == "no-time":
        for name in STEPS:
            want(name, "skipped", "no time left" if name == "unpack" else "not unpacked")
    else:
        want("unpack", "passed")
        want("machine", "passed")
        for name in GO_ON_DOUBLES:
            if expect == "doubles":
                want(name, "passed")
                counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed)", steps[name]["tests"]))
                if counts.get("passed", 0) == 0 or counts.get("failed") != 0:
                    problems.append(f"{name}: tests {steps[name]['tests']!r}")
        for name, reason in NO_GPU[expect].items():
            want(name, "skipped", reason)
        if has_nixl:
            want("go-nixl", "passed")
        else:
            want("go-nixl", "skipped", "no NIXL")
        machine = summary["machine"]
        if not isinstance(machine, dict) or "rdt" not in machine:
            problems.append(f"machine: {machine!r}")
        else:
            # Each fact is there, had or "not available: <why>".
            for fact in MACHINE_FACTS:
                if fact not in machine:
                    problems.append(f"machine: no {fact!r}")
                elif isinstance(machine[fact], str) and not machine[fact].startswith("not available: "):
                    problems.append(f"machine: {fact}: {machine[fact]!r}")
            if has_nixl and not (isinstance(machine.get("ucx"), dict) and machine["ucx"]["version"][:1].isdigit()):
                problems.append(f"machine: the packed NIXL's UCX version: {machine.get('ucx')!r}")
            if expect == "doubles" and not (isinstance(machine.get("nccl"), dict)
                                            and machine["nccl"]["version"][:1].isdigit()):
                problems.append(f"machine: the NCCL version: {machine.get('nccl')!r}")
    return problems


def main():
    expect, out = sys.argv[1], sys.argv[2]
    problems = check(expect, out)
    if problems:
        print(f"gpu-pack-test: FAILED ({expect}, {out}/summary.json):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        sys.exit(1)
    print(f"gpu-pack-test: {expect}: as expected ({out}/summary.json)")


if __name__ == "__main__":
    main()
