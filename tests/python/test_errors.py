"""Bad input gets a clear error of the right class, never a crash."""

import asyncio
import os
import pickle
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import rdt
import transports_for_tests as tt

pytestmark = pytest.mark.timeout(60)


def test_every_error_is_an_rdt_error_with_a_status():
    classes = [getattr(rdt, n) for n in rdt.__all__ if n.endswith("Error")]
    assert len({c.status for c in classes if c is not rdt.RdtError}) == len(classes) - 1
    assert all(issubclass(c, rdt.RdtError) for c in classes)
    assert issubclass(rdt.GetTimeoutError, TimeoutError)
    assert issubclass(rdt.PeerUnavailableError, ConnectionError)
    assert issubclass(rdt.InvalidArgumentError, ValueError)


def test_non_contiguous_arrays():
    with pytest.raises(rdt.InvalidArgumentError, match="not C-contiguous.*ascontiguousarray"):
        rdt.put(np.arange(20.0).reshape(4, 5)[:, ::2])
    with pytest.raises(rdt.InvalidArgumentError, match="tensor 1"):
        rdt.put([np.ones(3), np.ones((3, 3)).T])
    with pytest.raises(rdt.InvalidArgumentError, match="not contiguous"):
        rdt.put(tt.DLPackOnly(np.arange(20.0).reshape(4, 5)[:, ::2]))


def test_unsupported_dtypes_and_objects():
    with pytest.raises(rdt.UnsupportedError, match="dtype <U1"):
        rdt.put(np.array(["a", "b"]))
    with pytest.raises(rdt.UnsupportedError, match="dtype object"):
        rdt.put(np.array([object()]))
    with pytest.raises(rdt.UnsupportedError, match="native byte order"):
        rdt.put(np.arange(3, dtype=">i4"))
    with pytest.raises(rdt.UnsupportedError, match="datetime64"):
        rdt.put(np.array(["2024-01-01"], dtype="datetime64[D]"))
    with pytest.raises(rdt.UnsupportedError, match="cannot use a Weird as a tensor"):
        rdt.wait_tensor_freed(Weird())
    with pytest.raises(rdt.InvalidArgumentError, match="cannot be pickled"):
        rdt.put({"x": np.ones(1), "lock": threading.Lock()})


class Weird:
    pass


def test_bad_arguments():
    with pytest.raises(rdt.InvalidArgumentError):
        rdt.get(["not a ref"])
    with pytest.raises(rdt.InvalidArgumentError):
        rdt.get(42)
    assert rdt.get([]) == []
    ref = rdt.put(np.ones(3))
    with pytest.raises(rdt.InvalidArgumentError, match="timeout"):
        rdt.get(ref, timeout=-1)
    with rdt.Runtime("other") as other:
        with pytest.raises(rdt.NotFoundError):
            other.get(other.borrow(ref), transport="no-such-transport")
    with pytest.raises(rdt.InvalidArgumentError, match="log_level"):
        rdt.Runtime(log_level="loud")


@pytest.mark.parametrize("name,value", [("RDT_CMA_WORKERS", "0"), ("RDT_CMA_WORKERS", "abc"),
                                        ("RDT_TCP_STREAMS", "17"), ("RDT_LOG", "loud")])
def test_a_bad_environment_variable_fails_runtime_creation_by_name(name, value):
    # The library reads its environment as it was when it loaded: a child
    # process gets the value from the start.
    probe = (
        "import rdt\n"
        "try:\n"
        "    rdt.Runtime('env')\n"
        "except rdt.InvalidArgumentError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, **{name: value}),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f'{name}="{value}"' in out.stdout, out.stdout


def test_corrupt_and_foreign_bytes():
    rt = rdt.default_runtime()
    with pytest.raises(rdt.CorruptError):
        rt.deserialize(b"RDTR garbage")
    good = rdt.put(np.ones(3)).serialize()
    with pytest.raises(rdt.CorruptError):
        rt.deserialize(good[:-5])
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(rdt.CorruptError):
        rt.deserialize(bytes(damaged))
    with pytest.raises(Exception):
        pickle.loads(pickle.dumps(rdt.put(np.ones(1)))[:-10])
    with rdt.Runtime("other") as other:
        r = other.deserialize(good)  # bytes as another language makes them: one tensor, no structure
        assert other.get(r).tolist() == [1.0, 1.0, 1.0]


def test_released_refs_and_closed_runtimes():
    ref = rdt.put(np.ones(3))
    ref.close()
    ref.close()  # idempotent
    assert repr(ref) == "ObjectRef(<released>)"
    with pytest.raises(rdt.ClosedError):
        ref.serialize()
    with pytest.raises(rdt.ClosedError):
        rdt.get(ref)
    with pytest.raises(rdt.ClosedError):
        pickle.dumps(ref)
    with rdt.Runtime("x") as rt:
        pass
    with pytest.raises(rdt.ClosedError):
        rt.put(np.ones(1))


def test_tokenless_tcp_address_carries_a_secret_that_repr_hides():
    with rdt.Runtime("capability", listen_tcp="127.0.0.1:0") as rt:
        tcp = [p for p in rt.address.split(",") if p.startswith("tcp://")]
        assert len(tcp) == 1
        secret, hostport = tcp[0][len("tcp://"):].rsplit("@", 1)
        assert len(secret) == 64 and hostport.startswith("127.0.0.1:")
        assert secret not in repr(rt)
        assert "tcp://****@127.0.0.1:" in repr(rt)


# ---- timeouts: one rule for every call that takes one -------------------------------------------

@pytest.fixture(scope="module")
def pair():
    """An owner and a reader runtime: a put object, one exposed for writes,
    and the reader's refs to both."""
    with rdt.Runtime("t-owner") as a, rdt.Runtime("t-reader") as b:
        ref, exposed = a.put(np.arange(8.0)), a.expose(np.zeros(8))
        yield a, b, ref, b.borrow(ref), exposed, b.borrow(exposed)


def _prepared_run(b, r, t):
    with b.prepare_get(r) as p:
        return p.run(timeout=t)


def _deserialized(b, ref, t):
    b.deserialize(ref.serialize(), timeout=t).close()


def _notice(b, w, exposed, t):
    b.write(w, np.ones(8))  # one notice waits, so that no limit returns too
    return exposed.wait_notice(t)


def _notice_async(b, w, exposed, t):
    b.write(w, np.ones(8))
    return asyncio.run(exposed.wait_notice_async(t))


def _runtime(**options):
    rdt.Runtime("t-options", **options).close()


# name -> call(pair, timeout)
TIMEOUT_CALLS = {
    "get": lambda p, t: p[1].get(p[3], timeout=t),
    "get(copy=False)": lambda p, t: p[1].get(p[3], timeout=t, copy=False),
    "get_async": lambda p, t: asyncio.run(p[1].get_async(p[3], timeout=t)),
    "Fetch.wait": lambda p, t: p[1].get_start(p[3]).wait(t),
    "Fetch.result": lambda p, t: p[1].get_start(p[3]).result(t),
    "Prepared.run": lambda p, t: _prepared_run(p[1], p[3], t),
    "write": lambda p, t: p[1].write(p[5], np.ones(8), timeout=t),
    "write_async": lambda p, t: asyncio.run(p[1].write_async(p[5], np.ones(8), timeout=t)),
    "wait_tensor_freed": lambda p, t: p[1].wait_tensor_freed(np.ones(2), timeout=t),
    "rdt.wait_tensor_freed": lambda p, t: rdt.wait_tensor_freed(np.ones(2), timeout=t),  # held by none
    "deserialize": lambda p, t: _deserialized(p[1], p[2], t),
    "wait_notice": lambda p, t: _notice(p[1], p[5], p[4], t),
    "wait_notice_async": lambda p, t: _notice_async(p[1], p[5], p[4], t),
    "revoke_writes": lambda p, t: p[0].expose(np.zeros(2)).revoke_writes(t),
    "Runtime(deserialize_timeout)": lambda p, t: _runtime(deserialize_timeout=t),
    "Runtime(peer_timeout)": lambda p, t: _runtime(peer_timeout=t),
    "Runtime(lease)": lambda p, t: _runtime(lease=t),
}


@pytest.mark.parametrize("call", sorted(TIMEOUT_CALLS))
def test_every_timeout_takes_none_infinity_and_seconds(pair, call):
    for t in (None, float("inf"), 30, 2.5, 10 ** 400):
        TIMEOUT_CALLS[call](pair, t)
    if not call.startswith("Runtime"):  # a runtime's durations must be positive
        try:
            TIMEOUT_CALLS[call](pair, 0)
        except rdt.GetTimeoutError:
            pass  # what 0 does is the library's to say; it is no bad argument


@pytest.mark.parametrize("call", sorted(TIMEOUT_CALLS) + ["create_collective_group"])
def test_a_bad_timeout_is_refused_naming_it(pair, call):
    def run(t):
        if call == "create_collective_group":
            return pair[1].create_collective_group(2, 1, pair[0].address, timeout=t)
        return TIMEOUT_CALLS[call](pair, t)
    for bad in (float("nan"), -1, -0.5, "5", True, b"1", [1]):
        with pytest.raises(rdt.InvalidArgumentError) as e:
            run(bad)
        assert repr(bad) in str(e.value), str(e.value)
        assert isinstance(e.value, TypeError) == (not isinstance(bad, (int, float)) or isinstance(bad, bool)), bad


def test_a_zero_timeout_reaches_the_library_as_zero():
    assert rdt._pending.ms_until(rdt._pending.deadline_of(0)) == 0
    assert rdt._pending.ms_until(rdt._pending.deadline_of(float("inf"))) == -1
    assert rdt._pending.ms_until(rdt._pending.deadline_of(1e300)) == (1 << 63) - 1  # the C ABI's int64


# ---- receiving what cannot be allocated -----------------------------------------------------------

class Claim:
    """Claims n bytes over a small buffer: put describes memory without
    reading it, so a ref can claim more than any machine has."""

    def __init__(self, base, n):
        self.base = base
        self.__array_interface__ = {"data": (base.ctypes.data, False), "shape": (n,), "typestr": "|u1",
                                    "version": 3}


def test_a_byte_range_past_the_end_is_refused_before_allocating(pair):
    r = pair[3]  # 8 float64: 64 bytes
    with pytest.raises(rdt.InvalidArgumentError, match=r"bytes \[0, 0\+1000000000000\) are outside the tensor's 64 "):
        pair[1].get(r[0].bytes(0, 10 ** 12))
    with pytest.raises(rdt.InvalidArgumentError, match=r"bytes \[16, 16\+7999999999984\) are outside"):
        pair[1].get(r[0][2:10 ** 12])  # rows past the last


def test_a_ref_claiming_more_than_this_machine_has_is_refused_before_allocating():
    base = np.zeros(16, np.uint8)
    tib = 1 << 40
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with rdt.Runtime("claims") as a, rdt.Runtime("reader") as b:
        ref = a.put([Claim(base, tib) for _ in range(1024)])
        r = b.borrow(ref)
        assert r.nbytes == 1024 * tib
        with pytest.raises(rdt.NoMemoryError, match=f"1024 tensors of {1024 * tib} bytes .* this machine's "
                                                    f"{memory} bytes; nothing was allocated"):
            b.get(r)
        with pytest.raises(rdt.NoMemoryError, match=f"1 tensor of {tib} bytes"):
            b.get(r[3][0:tib])
        assert b.get(r[0][0:4]).tolist() == [0, 0, 0, 0]  # a part that fits moves
        r.close()
        ref.release(revoke_leases=True)


class CraftedRef:
    """Pickles as a ref whose tensor descriptions claim more tensors than an
    object may hold (the C bytes are a real ref's)."""

    def __init__(self, data, n):
        self.data, self.n = data, n

    def __reduce__(self):
        return rdt._default._unpickle_ref, (self.data, None, (), (((1,), 2, 64, 1, 1, 0),) * self.n, "")


def test_a_ref_claiming_more_tensors_than_an_object_holds_is_corrupt():
    with rdt.Runtime("owner") as a:
        ref = a.put(np.ones(1))
        crafted = pickle.loads(pickle.dumps(CraftedRef(ref.serialize(), (1 << 20) + 1)))
        with pytest.raises(rdt.CorruptError, match="claims 1048577 tensors; an object holds at most 1048576"):
            rdt.get(crafted)
        crafted.close()
        ref.release(revoke_leases=True)


# ---- what a newcomer trips on ----------------------------------------------------------------------

def test_a_put_without_a_tensor_is_refused_saying_how_to_make_one():
    for value, what in [([1.0] * 200000, "list, 200000 items"), ({"step": 3}, "dict, 1 item"), (3.5, "float")]:
        with pytest.raises(rdt.InvalidArgumentError, match=rf"\({what}\) holds no tensor.*numpy\.asarray\(value\)"):
            rdt.put(value)
    ref = rdt.put({"w": np.ones(2), "step": 3})  # beside a tensor, the rest travels with the ref
    assert rdt.get(ref)["step"] == 3


@pytest.mark.filterwarnings("ignore:rdt.get of an object put by this runtime")  # b borrowed it
def test_a_misspelt_transport_is_refused_for_own_refs_as_for_borrowed_ones(pair):
    a, b, ref, borrowed = pair[:4]
    with pytest.raises(rdt.NotFoundError) as theirs:
        b.get(borrowed, transport="cmaa")
    for call in (lambda: a.get(ref, transport="cmaa"), lambda: a.get_start([ref], transport="cmaa"),
                 lambda: a.prepare_get(ref, transport="cmaa"), lambda: asyncio.run(a.get_async(ref, transport="cmaa")),
                 lambda: a.get(ref, transport="cmaa", copy=False)):
        with pytest.raises(rdt.NotFoundError) as ours:
            call()
        # The same words; only the C function named first may differ (a view's).
        assert str(ours.value).split(": ", 1)[1] == str(theirs.value).split(": ", 1)[1]
        assert 'no transport named "cmaa"' in str(ours.value)
    x = a.get(ref)
    assert a.get(ref, transport="TCP") is x  # a name it has: still the put tensor itself


def test_a_builtin_transport_that_did_not_load_says_why(pair):
    a, b, ref, borrowed = pair[:4]
    missing = a.unavailable_transports()
    if not missing:
        pytest.skip("every built-in transport loaded on this host")
    name, why = sorted(missing.items())[0]
    with pytest.raises(rdt.NotFoundError) as e:
        b.get(borrowed, transport=name)
    assert f'no transport named "{name}"' in str(e.value) and why in str(e.value)
    with pytest.raises(rdt.NotFoundError, match=re.escape(why)):
        a.put(np.ones(2), transport=name)


def test_a_gone_owner_is_named_with_why_once_per_endpoint():
    with rdt.Runtime("reader") as b:
        with rdt.Runtime("gone") as a:
            address = a.address
            r = b.borrow(a.put(np.ones(2)))
        with pytest.raises(rdt.PeerUnavailableError) as e:
            b.get(r, timeout=30)
    assert f"no runtime reachable at {address}: not on this host or gone" in str(e.value), str(e.value)
    assert str(e.value).count(address) == 1, f"the owner's address is named once: {e.value}"
