"""Push weights into a ring of two buffers the receiver exposed once.

The receiver (an inference engine, say) exposes two slots shaped like its
state dict and hands the writable refs to the trainer. Every step the
trainer writes the new state dict into the next free slot, tagged with the
step, with a write prepared once per slot (rdt.prepare_write). The receiver
applies a version only once its notice says every byte
landed, then gives the slot back (a credit): a slow receiver slows the
trainer down instead of being overwritten.

    python examples/python/push_ring.py [transport ...]

With no argument it runs over every transport of this machine that writes.
Each run checks every byte of every version it applies.
"""

import multiprocessing as mp
import sys

import numpy as np

import rdt

STEPS = 6
SHAPES = {"embed": (1000, 256), "layer0.w": (256, 256), "layer0.b": (256,), "head": (256, 1000)}


def state_at(step):
    """The trainer's state dict after `step` steps (deterministic, so the
    receiver can check every byte)."""
    return {name: np.full(shape, step, np.float32) + np.arange(shape[-1], dtype=np.float32)
            for name, shape in SHAPES.items()}


def trainer(slots, credits, transport):
    """Writes each step's state dict into a free slot, tagged with the step.
    The writes are prepared once per slot: each step only refills the
    trainer's own state in place and runs the write."""
    state = state_at(0)
    pushes = [rdt.prepare_write(slot, state, transport=transport) for slot in slots]
    for step in range(1, STEPS + 1):
        k = credits.recv()  # blocks while both slots hold versions not yet applied
        for name, value in state_at(step).items():
            state[name][...] = value  # in place: the prepared writes hold these arrays
        pushes[k].run(tag=step, timeout=60)
    while credits.recv() != "done":  # the credits of the last versions
        pass
    for push in pushes:
        push.close()


def run(transport):
    live = {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}  # what serves requests
    with rdt.Runtime(f"receiver-{transport}") as rt:
        buffers = [{name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()} for _ in range(2)]
        slots = [rt.expose(b, transport=transport) for b in buffers]  # registered once
        ctx = mp.get_context("spawn")
        credits, theirs = ctx.Pipe()
        p = ctx.Process(target=trainer, args=(slots, theirs, transport))
        p.start()
        credits.send(0)
        credits.send(1)  # two credits: both slots are free
        applied = 0
        for step in range(1, STEPS + 1):
            k = (step - 1) % 2
            notice = slots[k].wait_notice(timeout=60)
            if not notice.ok:  # a torn version (the trainer died mid-write): never applied
                raise SystemExit(f"slot {k} is torn after version {applied}: {notice.error}")
            assert notice.tag == step, (notice.tag, step)
            want = state_at(step)
            for name in SHAPES:  # every byte of the version
                assert np.array_equal(buffers[k][name], want[name]), (step, name)
                live[name][...] = buffers[k][name]
            applied += 1
            credits.send(k)  # the slot is free for the next push
        credits.send("done")
        p.join(60)
        assert p.exitcode == 0
        for s in slots:
            s.revoke_writes(timeout=10)
    print(f"push_ring over {transport}: {applied} versions applied, every byte checked")


if __name__ == "__main__":
    names = sys.argv[1:]
    if not names:
        with rdt.Runtime("probe") as probe:
            names = [t["name"] for t in probe.transports() if t["writes"] and "cpu" in t["devices"]]
    for name in names:
        run(name)
