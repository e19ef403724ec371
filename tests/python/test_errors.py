"""Bad input gets a clear error of the right class, never a crash."""

import os
import pickle
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
