"""Writes into exposed objects: another process writes versions into
buffers this one exposed, and every write ends in one notice here."""

import asyncio
import pickle
import select

import numpy as np
import pytest

import rdt
import workers
from conftest import check_notices_after_writer_killed, wait_until

pytestmark = pytest.mark.timeout(120)


def exposed_buffers():
    return {"w": np.zeros((64, 16), np.float32), "b": np.zeros(100, np.uint8)}


def same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("transport", [None, "shm"])
def test_another_process_writes_versions_and_each_notice_follows_its_bytes(child, transport):
    with rdt.Runtime("owner") as rt:
        bufs = exposed_buffers()
        ref = rt.expose(bufs, transport=transport)
        assert ref.writable and ref.is_owner
        c = child(workers.writer, pickle.dumps(ref), transport)
        assert c.recv() == "ready"
        for tag in (1, 2, 3):
            c.send(("whole", tag))
            assert c.recv() == "ok"
            n = ref.wait_notice(timeout=30)
            assert n.ok and n.error is None and n.tag == tag
            assert n.nbytes == bufs["w"].nbytes + bufs["b"].nbytes
            assert same(bufs, workers.version_of(tag)), f"version {tag} landed whole"
        with pytest.raises(rdt.GetTimeoutError):
            ref.wait_notice(timeout=0)  # one notice per write

        # Rows 8..15 of "w": nothing else changes.
        c.send(("rows", 9))
        assert c.recv() == "ok"
        n = ref.wait_notice(timeout=30)
        assert n.ok and n.tag == 9 and n.nbytes == 8 * 16 * 4
        want = workers.version_of(3)
        want["w"][8:16] = workers.version_of(9)["w"][8:16]
        assert same(bufs, want)
        c.stop()


def test_notice_descriptor_and_asyncio(child):
    with rdt.Runtime("owner") as rt, rdt.Runtime("local-writer") as other:
        bufs = exposed_buffers()
        ref = rt.expose(bufs)
        fd = ref.notice_fd()
        assert select.select([fd], [], [], 0)[0] == []
        w = other.borrow(ref)

        async def main():
            waiting = asyncio.ensure_future(ref.wait_notice_async(timeout=30))
            await asyncio.sleep(0)
            await other.write_async(w, workers.version_of(4), tag=4, timeout=30)
            return await waiting

        n = asyncio.run(main())
        assert n.ok and n.tag == 4
        assert same(bufs, workers.version_of(4))
        assert select.select([fd], [], [], 0)[0] == [], "no notice left"

        # A write started and awaited like a fetch.
        op = other.write_start(w, workers.version_of(5), tag=5)
        assert op.wait(30) and op.result() is None
        assert select.select([fd], [], [], 30)[0] == [fd]
        assert ref.wait_notice(0).tag == 5
        with pytest.raises(rdt.GetTimeoutError):
            asyncio.run(ref.wait_notice_async(timeout=0.05))
        w.close()


def test_refusals_write_nothing(child):
    with rdt.Runtime("owner") as rt, rdt.Runtime("writer") as other:
        bufs = exposed_buffers()
        ref = rt.expose(bufs)
        w = other.borrow(ref)
        with pytest.raises(rdt.InvalidArgumentError, match="never fetched"):
            other.get(w)
        with pytest.raises(rdt.InvalidArgumentError, match="exposed object has 2"):
            other.write(w, [bufs["w"]])
        with pytest.raises(rdt.InvalidArgumentError, match="exposed tensor"):
            other.write(w, {"w": np.zeros((64, 16), np.float64), "b": bufs["b"]})
        with pytest.raises(rdt.InvalidArgumentError):
            other.write(w["b"].bytes(90, 20), np.zeros(20, np.uint8))  # past the end
        put = other.borrow(rt.put(np.zeros(4)))
        with pytest.raises(rdt.InvalidArgumentError, match="not writable"):
            other.write(put, np.ones(4))
        with pytest.raises(rdt.InvalidArgumentError, match="owner"):
            w.wait_notice(0)  # a writer's ref takes no notices
        assert same(bufs, exposed_buffers())
        with pytest.raises(rdt.GetTimeoutError):
            ref.wait_notice(0)

        # Revoked: later writes are refused, in another process too.
        ref.revoke_writes(timeout=30)
        with pytest.raises(rdt.PermissionDeniedError, match="revoked"):
            other.write(w, workers.version_of(1), timeout=30)
        c = child(workers.writer, pickle.dumps(w))
        assert c.recv() == "ready"
        c.send(("whole", 2))
        assert c.recv().startswith("PermissionDeniedError")
        c.stop()
        assert same(bufs, exposed_buffers())


def test_a_writer_killed_mid_loop_never_leaves_a_false_success(child):
    with rdt.Runtime("owner") as rt:
        bufs = {"w": np.zeros((4096, 1024), np.float32), "b": np.zeros(100, np.uint8)}
        ref = rt.expose(bufs)
        c = child(workers.writer, pickle.dumps(ref))
        assert c.recv() == "ready"

        c.send(("loop", 1))
        assert c.recv() == "looping"
        first = ref.wait_notice(timeout=60)
        assert first.ok and first.tag == 1
        assert wait_until(lambda: rt.stats()["writes_open"] == 1, 60)
        c.kill()
        assert wait_until(lambda: rt.stats()["writes_open"] == 0, 60)
        check_notices_after_writer_killed(
            ref, first, lambda tag: (bufs["w"] == tag % 251).all() and (bufs["b"] == tag % 251).all())


def test_writable_refs_pickle_with_their_structure():
    with rdt.Runtime("owner") as rt:
        ref = rt.expose(exposed_buffers())
        back = pickle.loads(pickle.dumps(ref))
        assert back.writable and back.shapes == [(64, 16), (100,)]
        assert rt.stats()["writes_open"] == 0
        assert "writes_completed" in rt.stats()
        del back


def test_one_write_into_two_objects_by_slices_and_whole():
    with rdt.Runtime("owner") as rt, rdt.Runtime("writer") as other:
        a, b = exposed_buffers(), {"v": np.zeros(32, np.int64)}
        ra, rb = rt.expose(a), rt.expose(b)
        wa, wb = other.borrow(ra), other.borrow(rb)
        rows = np.full((4, 16), 7.0, np.float32)
        v = np.arange(32, dtype=np.int64)
        other.write([wa["w"][60:64], wb], [rows, {"v": v}], tag=11, timeout=30)
        na, nb = ra.wait_notice(30), rb.wait_notice(30)
        assert (na.tag, na.nbytes, nb.tag, nb.nbytes) == (11, rows.nbytes, 11, v.nbytes)
        assert na.ok and nb.ok
        assert (a["w"][60:64] == 7.0).all() and (a["w"][:60] == 0).all() and (a["b"] == 0).all()
        assert np.array_equal(b["v"], v)
        with pytest.raises(rdt.InvalidArgumentError, match="list of as many values"):
            other.write([wa, wb], [workers.version_of(1)])
        wa.close()
        wb.close()


# Transports written against the TensorTransportManager interface write too
# (can_write_transport and write_multiple_tensors, rdt's additions). PyVm
# writes with process_vm_writev into the addresses the owner's
# extract_tensor_transport_metadata published: the owner runs nothing.
PYVM = [("pyvm", "transports_for_tests", "PyVm"), ("pyvm-fail", "transports_for_tests", "FailingWrite")]


def test_a_python_transport_writes_into_another_process(child):
    import transports_for_tests as tt
    with rdt.Runtime("py-writer") as rt:
        for name, _, cls in PYVM:
            rt.register_tensor_transport(name, ["cpu"], getattr(tt, cls))
        info = {t["name"]: t for t in rt.transports()}
        assert info["pyvm"]["writes"] and info["pyvm"]["one_sided"]
        c = child(workers.exposer, [name for name, _, _ in PYVM], PYVM)
        blobs = c.recv()
        w = rt.deserialize(blobs["pyvm"])
        assert w.writable and not w.is_owner and w.transport == "pyvm"

        v = (np.arange(4096) * 7 % 251).astype(np.uint8)
        rt.write(w, v, tag=41, timeout=30)
        c.send(("notice", "pyvm"))
        ok, tag, error, landed = c.recv()
        assert ok and tag == 41 and error is None
        assert np.array_equal(landed, v)

        # A write that raises: the writer gets the exception's message, the
        # owner a failure notice with the writer's tag.
        wf = rt.deserialize(blobs["pyvm-fail"])
        with pytest.raises(rdt.RdtError, match="the link went down") as e:
            rt.write(wf, v, tag=42, timeout=30)
        assert "pyvm-fail" in str(e.value) and "RuntimeError" in str(e.value)
        c.send(("notice", "pyvm-fail"))
        ok, tag, error, landed = c.recv()
        assert not ok and tag == 42 and "the link went down" in error
        w.close()
        wf.close()
        c.stop()


SLOW = [("slow", "transports_for_tests", "SlowWrite"), ("slow-abort", "transports_for_tests", "SlowAbortableWrite")]


def test_a_write_past_its_deadline_fails_for_the_writer_and_the_owner_alike(child):
    """Application transports with and without abort land the bytes and
    return after the writer's deadline: the writer gets GetTimeoutError, and
    the owner's notice says the write failed (one outcome for both)."""
    import transports_for_tests as tt
    with rdt.Runtime("slow-writer") as rt:
        for name, _, cls in SLOW:
            rt.register_tensor_transport(name, ["cpu"], getattr(tt, cls))
        c = child(workers.exposer, [name for name, _, _ in SLOW], SLOW)
        blobs = c.recv()
        v = np.full(4096, 7, np.uint8)
        for name, _, _ in SLOW:
            w = rt.deserialize(blobs[name])
            # The write's own words, not a get's.
            with pytest.raises(rdt.GetTimeoutError, match=r"rdt\.write: the deadline passed before the write "
                                                          r"into 1 object ended; it was aborted"):
                rt.write(w, v, tag=51, timeout=0.5)
            c.send(("notice", name))
            ok, tag, error, landed = c.recv()
            assert not ok and tag == 51, f"{name}: the owner was told the write landed"
            assert "within" in error or "abort" in error, error
            assert np.array_equal(landed, v), f"{name}: the bytes did land (the notice says not to trust them)"
            if name == "slow":  # (the other one was aborted above, and no longer waits)
                with rt.write_start(w, v, tag=52) as wr:
                    with pytest.raises(rdt.GetTimeoutError, match=r"rdt\.Write\.result: the write into 1 object "
                                                                  r"did not end within 0\.1 s; the write is still"):
                        wr.result(timeout=0.1)
            w.close()
        c.stop()


def test_a_python_transport_that_writes_must_be_one_sided_and_define_the_write():
    import transports_for_tests as tt
    with rdt.Runtime("py-refusals") as rt:
        with pytest.raises(rdt.InvalidArgumentError, match="RDT_TRANSPORT_ONE_SIDED"):
            rt.register_tensor_transport("twosided-write", ["cpu"], tt.TwoSidedWrite)
        with pytest.raises(TypeError, match="write_multiple_tensors"):
            rt.register_tensor_transport("no-write", ["cpu"], tt.SaysWritesWithoutWrite)
        # A transport written for Ray (no can_write_transport) does not write.
        rt.register_tensor_transport("reads-only", ["cpu"], tt.PyShm)
        assert not {t["name"]: t for t in rt.transports()}["reads-only"]["writes"]
        with pytest.raises(rdt.UnsupportedError):
            rt.expose(np.zeros(4, np.uint8), transport="reads-only")


def test_one_array_writes_agree_with_the_general_path(child):
    """A write of one array into a ref of one tensor takes the one-call
    path when it can (a writable array) and the general one otherwise (a
    read-only one): each lands its bytes and makes one notice with its
    tag, in order; what neither takes (a strided array, another size) is
    refused with nothing written."""
    c = child(workers.exposer, ["cma", "tcp"], [])
    blobs = c.recv()
    with rdt.Runtime("one-array-writer") as rt:
        for name in ("cma", "tcp"):
            w = rt.deserialize(blobs[name])
            ro = np.full(4096, 3, np.uint8)
            ro.setflags(write=False)
            for tag, v in ((1, np.full(4096, 2, np.uint8)), (2, ro), (3, np.full(4096, 5, np.uint8))):
                rt.write(w, v, tag=tag, transport=name)
                c.send(("notice", name))
                ok, got, error, landed = c.recv()
                assert ok and got == tag, (name, tag, error)
                assert np.array_equal(landed, v), (name, tag)
            for bad in (np.full(8192, 4, np.uint8)[::2], np.zeros(4095, np.uint8)):
                with pytest.raises(rdt.InvalidArgumentError):
                    rt.write(w, bad, tag=9, transport=name)
            rt.write(w, np.full(4096, 8, np.uint8), tag=4, transport=name)
            c.send(("notice", name))
            assert c.recv()[:2] == (True, 4), "the refused writes made no notice"
            w.close()
    c.stop()


def test_a_one_array_write_to_a_stopped_owner_times_out_and_its_notice_says_so(child):
    """The one-call path keeps the write's deadline: over tcp an owner
    stopped with SIGSTOP cannot land the bytes; the write raises
    GetTimeoutError at its deadline, aborted, and once the owner runs again
    its notice for that write says it failed."""
    from conftest import stop_process
    import os
    import signal
    c = child(workers.exposer, ["tcp"], [])
    blobs = c.recv()
    with rdt.Runtime("stopped-owner-writer") as rt:
        w = rt.deserialize(blobs["tcp"])
        v = np.full(4096, 6, np.uint8)
        rt.write(w, v, tag=1, transport="tcp")  # the admission stands for the next write
        c.send(("notice", "tcp"))
        assert c.recv()[:2] == (True, 1)
        stop_process(c.proc.pid)
        try:
            with pytest.raises(rdt.GetTimeoutError, match=r"rdt\.write: the deadline passed before the write "
                                                          r"into 1 object ended; it was aborted"):
                rt.write(w, v, tag=2, timeout=0.5, transport="tcp")
        finally:
            os.kill(c.proc.pid, signal.SIGCONT)
        c.send(("notice", "tcp"))
        ok, tag, error, _ = c.recv()
        assert not ok and tag == 2, (ok, tag, error)
        w.close()
    c.stop()
