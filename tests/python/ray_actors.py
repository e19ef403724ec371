"""Actors for the Ray tests (test_ray*.py). They live in a module of their
own so that Ray's workers import them by name (the tests put this folder on
the workers' PYTHONPATH)."""

import os
import time
import zlib

import numpy as np
import ray
import torch

import rdt.ray

# Ray checks transport names where methods are decorated: register first
# (in workers the setup hook has already done it the same way).
rdt.ray.register()


def _crc(a):
    return zlib.crc32(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))


def summary(value):
    """A comparable description of a value that holds tensors: each tensor
    becomes (shape, dtype, CRC-32 of its bytes), the rest stays as is."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return ("tensor", tuple(t.shape), str(t.dtype), _crc(t.reshape(-1).view(torch.uint8).numpy()))
    if isinstance(value, np.ndarray):
        return ("ndarray", value.shape, str(value.dtype), _crc(value))
    if isinstance(value, dict):
        return {k: summary(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [summary(v) for v in value]
    return value


def make_value(kind, seed=0):
    """The values the tests send, by name."""
    g = torch.Generator().manual_seed(seed)
    if kind == "small":
        return torch.tensor([1.5, -2.0, 3.25]) + seed
    if kind == "500x500":
        return torch.randn(500, 500, generator=g)
    if kind == "dict":
        return {"w": torch.randn(64, 32, generator=g), "b": torch.arange(32, dtype=torch.int64) + seed,
                "step": 7 + seed, "name": "layer", "mask": torch.ones(5, dtype=torch.bool)}
    if kind == "mixed":
        return [torch.full((4, 4), 2.0 + seed), 42 + seed]
    if kind == "plasma":
        # A CPU part large enough for Ray to keep in its object store
        # (plasma), beside a tensor rdt moves.
        return {"t": torch.randn(128, generator=g), "blob": np.full(2 << 20, seed % 251, dtype=np.uint8)}
    if kind == "empty":
        return torch.empty(0, 3)
    if kind.startswith("bytes:"):
        n = int(kind[6:])
        return torch.full((n,), seed % 256, dtype=torch.uint8)
    raise ValueError(kind)


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Worker:
    """Makes, holds, receives and inspects tensors."""

    def __init__(self):
        self.kept = {}
        self.attempts = 0

    def pid(self):
        return os.getpid()

    def node(self):
        return ray.get_runtime_context().get_node_id()

    def ready(self):
        return True

    # ---- the source ----------------------------------------------------------

    @ray.method(tensor_transport="RDT")
    def make(self, kind, seed=0):
        return make_value(kind, seed)

    def plain(self, kind, seed=0):
        """A method without the transport: through Ray's object store."""
        return make_value(kind, seed)

    @ray.method(tensor_transport="RDT")
    def make_kept(self, kind, seed=0):
        """The same tensors each call (kept here), to check identity."""
        if (kind, seed) not in self.kept:
            self.kept[(kind, seed)] = make_value(kind, seed)
        return self.kept[(kind, seed)]

    def is_kept(self, value, kind, seed=0):
        """Whether value holds the very tensor make_kept returned (no copy)."""
        mine = self.kept[(kind, seed)]
        return value is mine or (isinstance(value, torch.Tensor) and value.data_ptr() == mine.data_ptr())

    @ray.method(tensor_transport="RDT")
    def make_slowly(self, kind, seconds):
        time.sleep(seconds)
        return make_value(kind)

    @ray.method(tensor_transport="RDT")
    def fail(self):
        raise ValueError("the application failed")

    @ray.method(tensor_transport="RDT", max_task_retries=3, retry_exceptions=True)
    def flaky(self, kind):
        self.attempts += 1
        if self.attempts < 3:
            raise RuntimeError(f"attempt {self.attempts} fails")
        return make_value(kind, 1)

    def put_now(self, kind, seed=0):
        """ray.put with the transport; the ref goes back in a list so that
        Ray hands the ref, not the value, to the caller."""
        value = make_value(kind, seed)
        return [ray.put(value, _tensor_transport="RDT")]

    def block(self, seconds):
        time.sleep(seconds)
        return True

    def write_after_free(self, receiver, kind):
        """Puts a tensor, has another actor read it, waits until Ray frees it,
        then writes into it in place (as a trainer updating weights does)."""
        t = make_value(kind)
        before = summary(t)
        ref = ray.put(t, _tensor_transport="RDT")
        got = ray.get(receiver.consume.remote(ref))
        del ref
        ray.experimental.wait_tensor_freed(t, timeout=30)
        t.add_(1)
        return got == before, rdt.ray.runtime().stats()

    # ---- the receiver --------------------------------------------------------

    def consume(self, value):
        return summary(value)

    def consume_at(self, value):
        """The value's summary and the address of its memory."""
        return summary(value), value.data_ptr()

    def consume_two(self, a, b):
        return summary(a), summary(b), a is b

    def consume_nested(self, refs):
        return summary(ray.get(refs[0]))

    def hold(self, refs):
        self.kept["held"] = refs
        return True

    def drop_held(self):
        self.kept.pop("held", None)
        return True

    # ---- what rdt holds -------------------------------------------------------

    def stats(self):
        return rdt.ray.runtime().stats()

    def receives(self):
        from ray.experimental.rdt import util
        return util.get_tensor_transport_manager("RDT").receives()

    def address(self):
        return rdt.ray.runtime().address

    def bytes_by_transport(self):
        return {t["name"]: t["bytes_received"] for t in rdt.ray.runtime().transports() if t["bytes_received"]}

    def registered(self):
        from ray.experimental.rdt import util
        return sorted(util.transport_manager_info)

    def extract_twice(self):
        """What a retried task does: extract for the same object id again,
        first with the same tensors, then with new ones."""
        tr = rdt.ray.RdtTensorTransport()
        a = [torch.ones(10)]
        first = tr.extract_tensor_transport_metadata("retried", a)
        same = tr.extract_tensor_transport_metadata("retried", a)
        b = [torch.ones(10)]
        retried = tr.extract_tensor_transport_metadata("retried", b)
        objects = rdt.ray.runtime().stats()["objects"]
        tr.garbage_collect("retried", retried, b)
        return same is first, retried.ref != first.ref, objects, rdt.ray.runtime().stats()["objects"]

    def extract_for_probe(self, kind):
        """Metadata of an object made outside Ray's bookkeeping."""
        self.probe = rdt.ray.RdtTensorTransport()
        return self.probe.extract_tensor_transport_metadata("probe", [make_value(kind)])

    def fetch_then_abort(self, meta, after):
        """Starts a fetch as Ray does, has another thread call
        abort_transport after `after` seconds (as Ray's failure handling
        does), and says how the wait ended and when."""
        import threading
        tr = rdt.ray.RdtTensorTransport()
        start = time.monotonic()
        req = tr.fetch_multiple_tensors("probe", meta, None)
        threading.Timer(after, tr.abort_transport, ("probe", None)).start()
        try:
            tr.wait_fetch_complete(req, 60)
            outcome = "completed"
        except rdt.AbortedError:
            outcome = "aborted"
        del req
        return outcome, time.monotonic() - start


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class AsyncWorker:
    """An async actor receiving RDT objects."""

    async def consume(self, value, delay=0.0):
        import asyncio
        await asyncio.sleep(delay)
        return summary(value)

    async def consume_later(self, refs, delay=0.0):
        """Waits, then reads the RDT ref it was handed inside a list, with
        ray.get on the event loop's executor."""
        import asyncio
        await asyncio.sleep(delay)
        value = await asyncio.get_running_loop().run_in_executor(None, ray.get, refs[0])
        return summary(value)

    async def await_ref(self, refs):
        return summary(await refs[0])

    async def get_in_executor(self, refs):
        import asyncio
        value = await asyncio.get_running_loop().run_in_executor(None, ray.get, refs[0])
        return summary(value)


    def stats(self):
        return rdt.ray.runtime().stats()

    def receives(self):
        from ray.experimental.rdt import util
        return util.get_tensor_transport_manager("RDT").receives()
