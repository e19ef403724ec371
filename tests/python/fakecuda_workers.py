"""cuda_ipc between processes on the test double of the CUDA driver
(tests/fakecuda), with no torch or CuPy: device memory comes from the
driver's cuMemAlloc through ctypes and is handed to rdt as an object with
__cuda_array_interface__, as CuPy and numba arrays are.

Everything here runs in processes started with RDT_CUDA_LIBRARY pointing at
the double (test_fake_cuda.py starts them): the library loads the driver
once per process, so the pytest process itself cannot switch to it.
"""

import ctypes
import multiprocessing as mp
import os
import pickle
import threading
import time
import types

import numpy as np

import rdt


class Driver:
    """The few driver calls the tests make themselves, with device 0's
    primary context current on the calling thread (as a framework's would be)."""

    def __init__(self):
        lib = ctypes.CDLL(os.environ["RDT_CUDA_LIBRARY"])
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t]
        lib.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
        lib.cuMemcpy.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_size_t]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.lib = lib
        self.check(lib.cuInit(0), "cuInit")
        ctx = ctypes.c_void_p()
        self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        self.check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.ctx = ctx.value

    @staticmethod
    def check(r, what):
        if r != 0:
            raise RuntimeError(f"{what}: CUresult {r}")

    def current(self):
        c = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(c)), "cuCtxGetCurrent")
        return c.value

    def alloc(self, n):
        p = ctypes.c_ulonglong()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(p), n), "cuMemAlloc")
        return p.value

    def memcpy(self, dst, src, n):
        self.check(self.lib.cuMemcpy(dst, src, n), "cuMemcpy")


class DeviceArray:
    """Device memory seen through __cuda_array_interface__: its own
    allocation, or a view at an offset in another array's."""

    def __init__(self, drv, shape, dtype, base=None, offset=0):
        self.drv, self.shape, self.dtype = drv, tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        if base is not None:
            self.ptr = base.ptr + offset
        else:
            self.ptr = drv.alloc(self.nbytes) if self.nbytes else 0
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.dtype.str,
                                         "data": (self.ptr, False), "strides": None, "version": 3}
        self.device = types.SimpleNamespace(id=0)

    def upload(self, a):
        a = np.ascontiguousarray(a, dtype=self.dtype)
        assert a.nbytes == self.nbytes
        if a.nbytes:
            self.drv.memcpy(self.ptr, a.ctypes.data, a.nbytes)

    def download(self):
        out = np.empty(self.shape, dtype=self.dtype)
        if self.nbytes:
            self.drv.memcpy(out.ctypes.data, self.ptr, self.nbytes)
        return out


def expected():
    return {"a": np.arange(1 << 18, dtype=np.float32).reshape(512, 512),
            "b": np.arange(1000, dtype=np.int64) * 3,
            "empty": np.zeros((0, 3), dtype=np.float32)}


def make_arrays(drv):
    """Two arrays at offsets in one allocation (as a caching allocator
    places them), and an empty one."""
    block = DeviceArray(drv, (3 << 20,), np.uint8)
    want = expected()
    arrays = {"a": DeviceArray(drv, want["a"].shape, want["a"].dtype, block, 4096),
              "b": DeviceArray(drv, want["b"].shape, want["b"].dtype, block, 4096 + want["a"].nbytes),
              "empty": DeviceArray(drv, (0, 3), np.float32)}
    return block, arrays


def targets(drv):
    want = expected()
    return [DeviceArray(drv, want[k].shape, want[k].dtype) for k in ("a", "b", "empty")]


def check(outs):
    want = expected()
    for k, o in zip(("a", "b", "empty"), outs):
        got = o.download()
        assert got.shape == want[k].shape and np.array_equal(got, want[k]), k


def source(conn):
    """Puts the arrays once with the automatic choice of transport and once
    with cuda_ipc, sends the pickled refs, and waits to be stopped."""
    drv = Driver()
    block, arrays = make_arrays(drv)
    for k, v in expected().items():
        arrays[k].upload(v)
    refs = {t: rdt.put(arrays, transport=t) for t in (None, "cuda_ipc")}
    conn.send({t: pickle.dumps(r) for t, r in refs.items()})
    try:
        conn.recv()
    except EOFError:
        pass


def start_source():
    ctx = mp.get_context("spawn")
    conn, end = ctx.Pipe()
    proc = ctx.Process(target=source, args=(end,))
    proc.start()
    end.close()
    if not conn.poll(60):
        raise TimeoutError("the source did not answer")
    return proc, conn, {t: pickle.loads(b) for t, b in conn.recv().items()}


def across_processes():
    drv = Driver()
    with rdt.Runtime("probe") as rt:
        assert "cuda_ipc" in rt.transport_names(), rt.transport_names()
    proc, conn, refs = start_source()
    try:
        for t, ref in refs.items():
            descs = ref.tensor_descs()
            assert [d.device_type for d in descs] == [rdt._tensors.DEVICE_NAMES["cuda"]] * 3, descs
            for _ in range(2):  # the second time from the receiver's handle cache
                outs = targets(drv)
                got = rdt.get(ref, out=outs, timeout=30)
                assert got["a"] is outs[0] and got["b"] is outs[1], got
                check(outs)
            assert drv.current() == drv.ctx, "rdt changed this thread's current CUDA context"
        # Without out=: rdt has nothing to allocate CUDA memory with here.
        try:
            rdt.get(refs["cuda_ipc"], timeout=30)
            raise AssertionError("a get of CUDA memory without torch, CuPy or out= succeeded")
        except rdt.UnsupportedError as e:
            assert "out=" in str(e), e
        # The source goes away: a clear error, never a hang.
        proc.kill()
        proc.join(30)
        try:
            rdt.get(refs["cuda_ipc"], out=targets(drv), timeout=30)
            raise AssertionError("a get from a killed source succeeded")
        except rdt.PeerUnavailableError:
            pass
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(30)
    print("across_processes: ok")


def across_devices():
    """CUDA memory lands in numpy arrays (cuda_ipc copies from the opened
    handle into host memory), whole and as rows; host memory lands in
    CUDA memory (staged through host memory, then copied to the device)."""
    drv = Driver()
    want = expected()
    proc, conn, refs = start_source()
    try:
        ref = refs["cuda_ipc"]
        outs = [np.full(want[k].shape, -1, dtype=want[k].dtype) for k in ("a", "b", "empty")]
        got = rdt.get(ref, out=outs, timeout=30)
        assert got["a"] is outs[0]
        for k, o in zip(("a", "b", "empty"), outs):
            assert np.array_equal(o, want[k]), k
        rows = rdt.get(ref["a"][100:110], out=np.zeros((10, 512), np.float32), timeout=30)
        assert np.array_equal(rows, want["a"][100:110])
        rows = rdt.get(refs[None]["b"][-4:], out=np.zeros(4, np.int64), timeout=30)  # the automatic choice
        assert np.array_equal(rows, want["b"][-4:])
        # device="cpu": new numpy arrays for a CUDA object, no out= needed.
        got = rdt.get(ref, device="cpu", timeout=30)
        for k in ("a", "b", "empty"):
            assert type(got[k]) is np.ndarray and np.array_equal(got[k], want[k]), k
        assert np.array_equal(rdt.get(ref["a"][5:7], device="cpu", timeout=30), want["a"][5:7])
    finally:
        proc.kill()
        proc.join(30)
    with rdt.Runtime("host") as a, rdt.Runtime("device") as b:
        ref = a.put({k: want[k] for k in ("a", "b", "empty")})
        outs = targets(drv)
        b.get(b.borrow(ref), out=outs, timeout=30)
        check(outs)
        half = DeviceArray(drv, (256, 512), np.float32)
        b.get(b.borrow(ref)["a"][256:], out=half, timeout=30)
        assert np.array_equal(half.download(), want["a"][256:])
    print("across_devices: ok")


def in_one_process():
    drv = Driver()
    block, arrays = make_arrays(drv)
    for k, v in expected().items():
        arrays[k].upload(v)
    with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
        ref = a.put(arrays, transport="cuda_ipc")
        outs = targets(drv)
        b.get(b.borrow(ref), out=outs, timeout=30)  # another runtime: the source's addresses
        check(outs)
        outs = targets(drv)
        a.get(ref, out=outs, timeout=30)  # its own object into new buffers: a local copy
        check(outs)
        assert drv.current() == drv.ctx
    print("in_one_process: ok")


def while_copying():
    """Run with RDT_FAKECUDA_COPY_DELAY_US: every copy takes that long."""
    delay = int(os.environ["RDT_FAKECUDA_COPY_DELAY_US"]) / 1e6
    drv = Driver()
    proc, conn, refs = start_source()
    try:
        ref = refs["cuda_ipc"]
        # A first get opens the connection and the source's handles, so
        # that the timed one starts its copies at once, well before its
        # deadline, even on a loaded machine.
        outs = targets(drv)
        rdt.get(ref, out=outs, timeout=60)
        check(outs)
        # The deadline passes while the copies run: get raises, and returns
        # only once nothing writes into the buffers (they hold every byte).
        outs = targets(drv)
        start = time.monotonic()
        try:
            rdt.get(ref, out=outs, timeout=delay / 2)
            raise AssertionError("a get of delayed copies met a deadline shorter than the delay")
        except rdt.GetTimeoutError:
            pass
        assert time.monotonic() - start >= delay * 0.9, "get returned while a copy still ran"
        check(outs)
        # The source is killed while the copies run: the get ends, with the
        # bytes or with PeerUnavailableError.
        outs = targets(drv)
        outcome = []

        def fetch():
            try:
                rdt.get(ref, out=outs, timeout=60)
                outcome.append("done")
            except rdt.RdtError as e:
                outcome.append(e)

        th = threading.Thread(target=fetch)
        th.start()
        time.sleep(delay / 4)
        proc.kill()
        th.join(90)
        assert not th.is_alive(), "a fetch from a killed source hung"
        assert outcome[0] == "done" or isinstance(outcome[0], rdt.PeerUnavailableError), outcome
        if outcome[0] == "done":
            check(outs)
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(30)
    print("while_copying: ok")


def legacy_stream():
    """rdt waits for CUDA's legacy default stream before copying a tensor a
    DLPack producer ordered there: work queued on it (a host function that
    takes a while, as a kernel would) is over when the wait returns, and
    the wait leaves the caller's current context as it was."""
    drv = Driver()
    lib = drv.lib
    done = []
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: (time.sleep(0.3), done.append(1)))
    lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    before = ctypes.c_void_p()
    drv.check(lib.cuCtxGetCurrent(ctypes.byref(before)), "cuCtxGetCurrent")
    drv.check(lib.cuLaunchHostFunc(1, ctypes.cast(callback, ctypes.c_void_p), None), "cuLaunchHostFunc")
    assert not done, "the queued work ended before the wait"
    rdt._cuda.DRIVER.wait_legacy_stream(0)
    assert done == [1], "the wait returned before the work queued on the legacy stream"
    after = ctypes.c_void_p()
    drv.check(lib.cuCtxGetCurrent(ctypes.byref(after)), "cuCtxGetCurrent")
    assert after.value == before.value
    try:
        rdt._cuda.DRIVER.wait_legacy_stream(7)
        raise AssertionError("a device the driver does not have")
    except rdt.RdtError as e:
        assert "cuDeviceGet" in str(e), e
    print("legacy_stream: ok")
