"""Draws bench/sync.png from what bench/sync_bench.py measured
(build/sync.json): the sync time against the model size for each method,
and the links' limit.

    python bench/sync_plot.py build/sync.json bench/sync.png
"""

import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAMES = {"tcp": "plain TCP relay (this machine's bound)", "rdt": "rdt, each host pulls all", "relay": "rdt relay: pull a third, push it on",
         "ray": "Ray object store (put + get)", "gloo": "gloo (gather + broadcast)"}


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f:
        r = json.load(f)
    sizes = r["sizes"]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for m, by_size in r["methods"].items():
        xs = [s for s in sizes if str(s) in by_size]
        ax.plot(xs, [statistics.median(by_size[str(s)]) for s in xs], marker="o", label=NAMES.get(m, m))
    ax.plot(sizes, [r["limits_s"]["3x"][str(s)] for s in sizes], linestyle="--", color="gray",
            label=f"links' limit, h0 sends 3 copies ({r['rate']})")
    ax.plot(sizes, [r["limits_s"]["1x"][str(s)] for s in sizes], linestyle=":", color="black",
            label="links' limit, each host receives 1 copy")
    ax.set_xlabel("model size (GB)")
    ax.set_ylabel("sync time (s): all three inference hosts hold the new version")
    ax.set_title("Weight sync, two trainer ranks to three hosts")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main()
