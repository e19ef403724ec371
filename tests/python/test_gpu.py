"""Device memory in the Python binding.

The first tests run everywhere: they describe CUDA memory without touching
it. The ones marked `gpu` need a CUDA device and skip with "no CUDA device"
elsewhere; `make gpu-test` runs them (pytest -m gpu).
"""

import os
import pickle
import threading
import time

import numpy as np
import pytest

import gpu_env
import rdt
import workers


class FakeCudaArray:
    """An object exporting __cuda_array_interface__ over an address nothing
    reads: enough to check how device memory is described and refused."""

    def __init__(self, shape, typestr="<f4", ptr=0x7f0000001000, device_id=0, strides=None, readonly=False):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, readonly),
                                         "strides": strides, "version": 3}
        self.device = type("Device", (), {"id": device_id})()


def test_cuda_array_interface_is_described_as_cuda_memory():
    with rdt.Runtime("a") as a:
        ref = a.put([FakeCudaArray((4, 8)), np.arange(3)])
        (d, h) = ref.tensor_descs()
        assert (d.device_type, d.device_id, d.shape, d.nbytes) == (rdt._tensors.DEVICE_NAMES["cuda"], 0, (4, 8), 128)
        assert h.device_type == rdt._tensors.DEVICE_NAMES["cpu"]
        ref2 = a.put(FakeCudaArray((2,), typestr="<i8", device_id=3))
        assert ref2.tensor_descs()[0].device_id == 3 and ref2.dtypes == ["int64"]


def test_cuda_array_interface_refusals():
    with rdt.Runtime("a") as a:
        with pytest.raises(rdt.InvalidArgumentError, match="contiguous"):
            a.put(FakeCudaArray((4, 8), strides=(4, 16)))
        with pytest.raises(rdt.UnsupportedError, match="which GPU"):
            x = FakeCudaArray((2,))
            del x.device
            a.put(x)


def test_fetching_cuda_memory_without_a_cuda_transport_is_a_clear_error():
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        if "cuda_ipc" in b.transport_names():
            pytest.skip("this machine has a CUDA transport")
        ref = a.put(FakeCudaArray((16,)))
        out = [FakeCudaArray((16,), ptr=0x7f0000100000)]
        with pytest.raises(rdt.UnsupportedError, match="cuda"):
            b.get(b.borrow(ref), out=out)
        with pytest.raises(rdt.InvalidArgumentError, match="read-only"):
            b.get(b.borrow(ref), out=[FakeCudaArray((16,), readonly=True)])
        # Its own object: a device copy needs a transport that can make one.
        with pytest.raises(rdt.UnsupportedError, match="cuda memory within a process"):
            a.get(ref, out=out)


class RecordingDLPack:
    """A DLPack producer that says it is on ``device`` (DLPack type, id)
    and records the keywords of each __dlpack__ call. Its capsule is
    numpy's, with the device rewritten to that one: enough to see what rdt
    asks for and what it does with a CUDA capsule, without a GPU."""

    def __init__(self, a, device=(2, 0), versioned=True):
        self._a, self.device, self.versioned, self.calls = a, device, versioned, []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kw):
        self.calls.append(dict(kw))
        if "max_version" in kw and not self.versioned:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        cap = self._a.__dlpack__(max_version=kw["max_version"]) if "max_version" in kw else self._a.__dlpack__()
        t = rdt._tensors
        if t._capsule_valid(cap, b"dltensor_versioned"):
            dl = t._DLTensor.from_address(t._capsule_pointer(cap, b"dltensor_versioned") + 32)
        else:
            dl = t._DLTensor.from_address(t._capsule_pointer(cap, b"dltensor"))
        dl.device.device_type, dl.device.device_id = self.device
        return cap


def test_dlpack_cuda_producer_is_asked_for_the_legacy_default_stream(monkeypatch):
    # DLPack: the consumer names the stream it will use (1: CUDA's legacy
    # default stream) and the producer orders its work before it; rdt
    # waits for that stream, since it copies on streams of its own.
    waited = []
    monkeypatch.setattr(rdt._tensors, "wait_legacy_stream", waited.append)
    p = RecordingDLPack(np.arange(12, dtype=np.float32), device=(rdt._tensors.DEVICE_NAMES["cuda"], 3))
    it = rdt._tensors.item_of(p)
    assert p.calls == [{"stream": 1, "max_version": (1, 0)}]
    assert (it.desc.device_type, it.desc.device_id, it.desc.shape) == (rdt._tensors.DEVICE_NAMES["cuda"], 3, (12,))
    assert waited == [3]
    # A producer without versioned capsules is asked again, still with the stream.
    old = RecordingDLPack(np.arange(4, dtype=np.int64), versioned=False)
    rdt._tensors.item_of(old)
    assert old.calls == [{"stream": 1, "max_version": (1, 0)}, {"stream": 1}]
    assert waited == [3, 0]
    # A host producer is asked for no stream (numpy refuses one), and nothing waits.
    host = RecordingDLPack(np.arange(4, dtype=np.int64), device=(rdt._tensors.DEVICE_NAMES["cpu"], 0))
    assert rdt._tensors.item_of(host).desc.device_type == rdt._tensors.DEVICE_NAMES["cpu"]
    assert host.calls == [{"max_version": (1, 0)}] and waited == [3, 0]
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        ref = a.put(RecordingDLPack(np.arange(6.0), device=(rdt._tensors.DEVICE_NAMES["cpu"], 0)))
        assert np.array_equal(b.get(b.borrow(ref)), np.arange(6.0))


# ---- with a GPU --------------------------------------------------------------

def _no_gpu(why):
    gpu_env.missing(f"no CUDA device: {why}")


def _torch_cuda():
    torch = gpu_env.cuda_torch("no CUDA device")
    with rdt.Runtime("probe") as rt:
        if "cuda_ipc" not in rt.transport_names():
            _no_gpu("the runtime lists no cuda_ipc transport")
    return torch


@pytest.mark.gpu
def test_torch_cuda_across_processes(child):
    torch = _torch_cuda()
    # The automatic choice moves a CPU tensor beside the CUDA ones; cuda_ipc,
    # named, moves device memory only (see test_cuda_ipc_refuses_host_tensors).
    for transport, what in [(None, "cuda_torch"), ("cuda_ipc", "cuda_torch_device_only")]:
        c = child(workers.serve, [transport], what)
        (ref,) = pickle.loads(c.recv()[transport])
        v = rdt.get(ref)
        assert v["f32"].device == torch.device("cuda:0")
        assert torch.equal(v["f32"], torch.arange(1 << 20, dtype=torch.float32, device="cuda:0").reshape(1024, 1024))
        assert torch.equal(torch.cat(v["pair"]), torch.arange(2048, dtype=torch.int64, device="cuda:0"))
        assert v["bf16"].dtype == torch.bfloat16 and v["empty"].shape == (0, 3)
        # Into the caller's buffers.
        out = [torch.empty(1024, 1024, device="cuda:0"), torch.empty(1024, dtype=torch.int64, device="cuda:0"),
               torch.empty(1024, dtype=torch.int64, device="cuda:0"), torch.empty(6, dtype=torch.bfloat16,
                                                                                   device="cuda:0"),
               torch.empty((0, 3), device="cuda:0")]
        if "cpu" in v:
            assert v["cpu"].device.type == "cpu" and torch.equal(v["cpu"], torch.arange(3))
            out.append(torch.empty(3, dtype=torch.int64))
        rdt.get(ref, out=out)
        assert torch.equal(out[0], v["f32"]) and torch.equal(out[2], v["pair"][1])
        ref.close()
        c.stop()


def _visible_ids(torch):
    """This process's GPUs as CUDA_VISIBLE_DEVICES names them, in its order."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    n = torch.cuda.device_count()
    return [v.strip() for v in env.split(",")][:n] if env else [str(i) for i in range(n)]


@pytest.mark.gpu
def test_get_lands_on_the_current_device_not_the_sources_ordinal(child):
    # The source numbers its GPUs otherwise (as under Ray or torchrun): its
    # cuda:1 is our cuda:0. Without out= or device= the tensor lands on our
    # current device, not on "cuda:1", a GPU of ours the source never used.
    torch = _torch_cuda()
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"needs two GPUs, for a source ordinal other than the receiver's device (this machine has {n})")
    ids = _visible_ids(torch)
    c = child(workers.serve_on_gpu, f"{ids[1]},{ids[0]}", 1, 1000)
    blob, ordinal = c.recv()
    assert ordinal == 1
    ref = pickle.loads(blob)
    prev = torch.cuda.current_device()
    torch.cuda.set_device(0)
    try:
        v = rdt.get(ref)
        assert v.device == torch.device("cuda", torch.cuda.current_device()) == torch.device("cuda:0")
        assert torch.equal(v.cpu(), torch.arange(1000))
    finally:
        torch.cuda.set_device(prev)
    ref.close()
    c.stop()


@pytest.mark.gpu
def test_get_follows_torch_cuda_set_device(child):
    # The receiver picks its GPU with torch.cuda.set_device: the highest one
    # that reaches GPU 0 (cuda_ipc copies between them), GPU 0 itself on a
    # machine of one.
    torch = _torch_cuda()
    n = torch.cuda.device_count()
    target = next((d for d in range(n - 1, 0, -1)
                   if torch.cuda.can_device_access_peer(d, 0) and torch.cuda.can_device_access_peer(0, d)), 0)
    c = child(workers.serve_on_gpu, None, 0, 1000)
    blob, ordinal = c.recv()
    assert ordinal == 0
    ref = pickle.loads(blob)
    want = torch.arange(1000)
    prev = torch.cuda.current_device()
    torch.cuda.set_device(target)
    try:
        v = rdt.get(ref)
        assert v.device == torch.device("cuda", target) and torch.equal(v.cpu(), want)
        # device= and out= still say where it lands.
        w = rdt.get(ref, device="cuda:0")
        assert w.device == torch.device("cuda:0") and torch.equal(w.cpu(), want)
        out = torch.empty(1000, dtype=torch.int64, device="cuda:0")
        rdt.get(ref, out=out)
        assert torch.equal(out.cpu(), want)
    finally:
        torch.cuda.set_device(prev)
    ref.close()
    c.stop()


@pytest.mark.gpu
def test_cuda_ipc_refuses_host_tensors():
    torch = _torch_cuda()
    with rdt.Runtime("a") as a:
        value = {"gpu": torch.arange(4, device="cuda:0"), "cpu": torch.arange(3)}
        with pytest.raises(rdt.UnsupportedError, match="tensor 1 is in cpu memory.*cuda_ipc"):
            a.put(value, transport="cuda_ipc")
        ref = a.put(value)  # the automatic choice moves both
        got = a.get(ref, out=[torch.empty(4, dtype=torch.int64, device="cuda:0"), torch.empty(3, dtype=torch.int64)])
        assert got["gpu"].device == torch.device("cuda:0") and torch.equal(got["gpu"].cpu(), torch.arange(4))
        assert torch.equal(got["cpu"], torch.arange(3))


@pytest.mark.gpu
def test_cuda_ipc_writes_into_exposed_device_memory():
    torch = _torch_cuda()
    with rdt.Runtime("owner") as a, rdt.Runtime("writer") as b:
        slots = {"w": torch.zeros(256, 64, device="cuda:0"), "b": torch.zeros(64, dtype=torch.int64, device="cuda:0")}
        ref = a.expose(slots, transport="cuda_ipc")
        theirs = b.borrow(ref)
        new = {"w": torch.randn(256, 64, device="cuda:0"), "b": torch.arange(64, device="cuda:0")}
        b.write(theirs, new, tag=7)
        n = ref.wait_notice(timeout=30)
        assert n.ok and n.tag == 7 and n.nbytes == 256 * 64 * 4 + 64 * 8
        assert torch.equal(slots["w"], new["w"]) and torch.equal(slots["b"], new["b"])
        # Rows 8..15 only: nothing else changes.
        rows = torch.full((8, 64), 5.0, device="cuda:0")
        b.write(theirs[0][8:16], rows, tag=8)
        assert ref.wait_notice(timeout=30).tag == 8
        want = new["w"].clone()
        want[8:16] = 5.0
        assert torch.equal(slots["w"], want)
        # A host source is refused before anything moves.
        with pytest.raises(rdt.UnsupportedError, match="from CUDA device memory"):
            b.write(theirs, {"w": torch.zeros(256, 64), "b": torch.zeros(64, dtype=torch.int64)}, transport="cuda_ipc")
        assert torch.equal(slots["w"], want)


@pytest.mark.gpu
def test_torch_cuda_in_one_process():
    torch = _torch_cuda()
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        x = torch.arange(1000, dtype=torch.float32, device="cuda:0") * 2
        ref = a.put(x, transport="cuda_ipc")
        y = b.get(b.borrow(ref))
        assert y.device == x.device and torch.equal(x, y)
        # The owner's own object: a local device copy.
        z = a.get(ref)
        assert torch.equal(x, z)


@pytest.mark.gpu
def test_cupy_across_processes(child):
    _torch_cuda()
    try:
        import cupy
    except ImportError:
        gpu_env.missing("CuPy is not installed (`make gpu-test` installs it)")
    c = child(workers.serve, [None], "cupy")
    (ref,) = pickle.loads(c.recv()[None])
    v = rdt.get(ref)
    assert isinstance(v, cupy.ndarray)
    assert bool((v == cupy.arange(1000, dtype=cupy.float64)).all())
    out = cupy.empty(1000, dtype=cupy.float64)
    rdt.get(ref, out=out)
    assert bool((out == v).all())
    ref.close()
    c.stop()


@pytest.mark.gpu
def test_killed_source_during_a_transfer(child):
    torch = _torch_cuda()
    c = child(workers.serve, [None], "cuda_big")
    (ref,) = pickle.loads(c.recv()[None])
    out = torch.empty(64 << 20, dtype=torch.int32, device="cuda:0")
    outcome = []

    def fetch():
        try:
            rdt.get(ref, out=[out], timeout=60)
            outcome.append("done")
        except rdt.RdtError as e:
            outcome.append(e)

    t = threading.Thread(target=fetch)
    t.start()
    c.kill()
    t.join(90)
    assert not t.is_alive(), "a fetch from a killed source hung"
    assert outcome[0] == "done" or isinstance(outcome[0], rdt.PeerUnavailableError), outcome
    # Afterwards: a clear error, never a hang.
    with pytest.raises(rdt.PeerUnavailableError):
        rdt.get(ref, out=[out], timeout=60)


# Clock cycles a kernel spins to hold a stream busy: about half a second at
# an H200's 1.98 GHz, longer on slower clocks.
SPIN_CYCLES = 1_000_000_000


@pytest.mark.gpu
def test_wait_legacy_stream_waits_for_queued_work():
    torch = _torch_cuda()
    with torch.cuda.stream(torch.cuda.default_stream(0)):  # torch's default stream is CUDA's legacy one
        torch.cuda._sleep(SPIN_CYCLES)
        ev = torch.cuda.Event()
        ev.record()
    assert not ev.query(), "the spinning kernel ended before it could be waited for"
    rdt._cuda.DRIVER.wait_legacy_stream(0)
    assert ev.query()


@pytest.mark.gpu
def test_dlpack_producer_writing_on_a_side_stream(child):
    # The source writes a tensor on a side stream and puts it, through
    # DLPack alone, while the write is still queued. rdt asks the producer
    # to order its work before the legacy default stream and waits for
    # that stream, so the put returns after the write and the receiver
    # gets the final bytes (rdt reads on streams of its own).
    _torch_cuda()
    n = 256 << 20
    c = child(workers.serve_dlpack_side_stream, n, SPIN_CYCLES)
    blob, took, done = c.recv(120)
    assert done, f"put returned after {took:.3f} s, before the side stream's write had finished"
    ref = pickle.loads(blob)
    got = rdt.get(ref, timeout=60)
    assert got.device.type == "cuda" and got.numel() == n
    assert bool((got == 7).all()), f"{int((got != 7).sum())} of {n} bytes are not the side stream's"
    ref.close()
    c.stop()


@pytest.mark.gpu
def test_pageable_device_to_host_get_under_a_deadline(child):
    # A copy from device memory into pageable host memory is synchronous in
    # the CUDA driver's call: a get of 2 GiB with a deadline far shorter
    # than the copy must still return, with GetTimeoutError, soon after
    # the deadline, and leave the runtime usable.
    _torch_cuda()
    deadline, margin = 0.05, 10.0
    c = child(workers.serve, [None], "cuda_2gib")
    (ref,) = pickle.loads(c.recv(120)[None])
    n = ref.tensor_descs()[0].nbytes
    out = np.empty(n, dtype=np.uint8)  # pageable, and not yet touched
    rdt.get(ref[0][:4096], out=out[:4096], timeout=60)  # the connection and the handle, opened
    t0 = time.monotonic()
    try:
        rdt.get(ref, out=[out], timeout=deadline)
        outcome = "returned"
    except rdt.GetTimeoutError:
        outcome = "timed out"
    took = time.monotonic() - t0
    assert took < deadline + margin, f"a get with a {deadline} s deadline returned after {took:.1f} s"
    assert outcome == "timed out", (f"{n >> 30} GiB into pageable memory arrived in {took:.3f} s, within the "
                                    f"{deadline} s deadline: no copy was cut short")
    out.fill(0)
    rdt.get(ref, out=[out], timeout=None)
    assert bool((out == 7).all())
    ref.close()
    c.stop()


@pytest.mark.gpu
def test_source_gpu_hidden_from_the_receiver(child, record_testsuite_property):
    # The source sees only GPU 1, the receiver only GPU 0 (as under Ray or
    # torchrun, one GPU each): cuda_ipc opens the source's memory on the
    # receiver's own device and copies across. Records the transport and
    # the speed of a 1 GiB fetch (properties of python-junit.xml's suite).
    torch = _torch_cuda()
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"needs two GPUs, one for the source and one for the receiver (this machine has {n})")
    if not (torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)):
        pytest.skip("GPUs 0 and 1 have no peer access: cuda_ipc cannot copy between them")
    ids = _visible_ids(torch)
    count = 1 << 27  # int64: 1 GiB
    src = child(workers.serve_on_gpu, ids[1], 0, count)
    blob, ordinal = src.recv(120)
    assert ordinal == 0
    rcv = child(workers.receive_on_gpu, ids[0], blob, count)
    status, *rest = rcv.recv(180)
    if status == "error":
        pytest.fail(f"the fetch failed: {rest[0]} (transports that completed transfers: {rest[1] or 'none'})")
    used, gbps, right = rest
    record_testsuite_property("hidden_gpu_fetch_transport", ",".join(used))
    record_testsuite_property("hidden_gpu_fetch_gb_per_s_1gib", f"{gbps:.1f}")
    print(f"GPU {ids[1]} -> GPU {ids[0]}, each hidden from the other's process: {used}, {gbps:.1f} GB/s at 1 GiB")
    assert used == ["cuda_ipc"], f"the fetch went over {', '.join(used) or 'no transport'}, not cuda_ipc"
    assert right, "the bytes arrived wrong"
    rcv.stop()
    src.stop()
