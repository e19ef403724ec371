"""The nixl transport (NIXL's DRAM path) between spawned processes. Skips
where NIXL's C API library is not loadable (RDT_NIXL_LIBRARY, or an
installed nixl wheel)."""

import pickle

import numpy as np
import pytest

import rdt
import workers

pytestmark = pytest.mark.timeout(120)


def nixl_available():
    return "nixl" in rdt.default_runtime().transport_names()


@pytest.fixture
def need_nixl():
    if not nixl_available():
        pytest.skip("NIXL is not available: set RDT_NIXL_LIBRARY to libnixl_capi.so or pip install nixl-cu12 "
                    "(make python-test installs it into build/nixl)")


def nixl_transfers():
    return {t["name"]: t["transfers_completed"] for t in rdt.default_runtime().transports()}.get("nixl", 0)


def test_get_over_nixl_between_processes(child, need_nixl):
    c = child(workers.serve, ["nixl", "cma"], "dtypes")
    sent = c.recv()
    want = workers.dtype_arrays()

    # Put with transport="nixl".
    refs = pickle.loads(sent["nixl"])
    assert refs[0].transport == "nixl"
    before = nixl_transfers()
    for g in rdt.get(refs, timeout=60):
        np.testing.assert_array_equal(g["tensor"], want[g["name"]])
    assert nixl_transfers() - before == sum(1 for r in refs if r.nbytes > 0)

    # Put for cma, fetched over nixl by name: the source registers on demand.
    refs = pickle.loads(sent["cma"])
    before = nixl_transfers()
    for r in refs:
        g = rdt.get(r, transport="nixl", timeout=60)
        np.testing.assert_array_equal(g["tensor"], want[g["name"]])
    assert nixl_transfers() - before == sum(1 for r in refs if r.nbytes > 0)
    c.stop()


def test_nixl_is_never_the_automatic_choice_for_host_memory(child, need_nixl):
    c = child(workers.serve, [None], "small")
    (ref,) = pickle.loads(c.recv()[None])
    before = nixl_transfers()
    np.testing.assert_array_equal(rdt.get(ref, timeout=30), np.arange(10.0))
    assert nixl_transfers() == before
    c.stop()
