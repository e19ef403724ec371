"""ObjectRef.release(revoke_leases=True): the owner frees an object at once
although pickled copies of its ref were never unpickled, whose leases would
otherwise hold it for two minutes (far longer than any wait here)."""

import pickle

import numpy as np
import pytest

import rdt
import workers
from conftest import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("transport", ["shm", "cma", None])
def test_revoking_release_frees_at_once_and_late_copies_fail(child, transport):
    with rdt.Runtime("revoker") as rt:
        x = np.arange(1000.0)
        ref = rt.put(x)
        blobs = [pickle.dumps(ref) for _ in range(3)]
        assert rt.stats()["refs_in_transit"] == 3
        ref.release(revoke_leases=True)
        assert ref.closed
        rt.wait_tensor_freed(x, timeout=10)
        # The counter may trail the wake-up by a moment.
        assert wait_until(lambda: rt.stats()["objects_freed"] == 1)
        s = rt.stats()
        assert (s["objects"], s["refs_in_transit"], s["leases_expired"], s["objects_freed"]) == (0, 0, 0, 1)
        ref.release(revoke_leases=True)  # idempotent, as close() is

        # Another process unpickles the copies: each get fails, clearly,
        # whether the owner says so (shm) or the cleared guard does (cma,
        # which then takes the owner's answer to the borrow).
        c = child(workers.fetch_each_in_child, blobs, transport)
        results = c.recv()
        assert [kind for kind, _ in results] == ["error"] * 3, results
        for _, msg in results:
            assert msg.startswith("NotFoundError") and "already freed" in msg, msg
        c.stop()


def test_revoking_release_keeps_a_borrow_of_another_process(child):
    with rdt.Runtime("revoker") as rt, rdt.Runtime("other") as other:
        x = np.arange(1000.0)
        ref = rt.put(x)
        c = child(workers.hold, pickle.dumps(ref))
        assert c.recv() == "holding"
        assert wait_until(lambda: rt.stats()["borrows"] == 1)  # the child's borrow is counted
        unused = pickle.dumps(ref)

        # Only the owner revokes: a borrowed handle refuses and stays open.
        borrowed = other.borrow(ref)
        with pytest.raises(rdt.InvalidArgumentError, match="only its owner"):
            borrowed.release(revoke_leases=True)
        assert not borrowed.closed
        borrowed.release()
        assert wait_until(lambda: rt.stats()["borrows"] == 1)  # returned asynchronously

        ref.release(revoke_leases=True)
        s = rt.stats()
        assert (s["objects"], s["borrows"], s["refs_in_transit"]) == (1, 1, 0)
        with pytest.raises(rdt.GetTimeoutError):
            rt.wait_tensor_freed(x, timeout=0.3)  # the child's borrow keeps it
        c.send("release")
        assert c.recv() == "released"
        rt.wait_tensor_freed(x, timeout=10)  # not held by the copy nobody unpickled
        assert rt.stats()["objects"] == 0

        late = child(workers.fetch_each_in_child, [unused], "shm")
        [(kind, msg)] = late.recv()
        assert kind == "error" and msg.startswith("NotFoundError") and "already freed" in msg, msg
        late.stop()
        c.proc.join(30)
