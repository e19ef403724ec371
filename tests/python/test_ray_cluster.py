"""rdt inside a Ray cluster of two nodes on one machine (Ray's own
ray.cluster_utils.Cluster): each Ray node counts as a host, so tcp moves
the bytes between nodes and cma/shm inside one, as on real hosts."""

import os

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (tests/python/requirements.txt pins it)")
torch = pytest.importorskip("torch", reason="rdt.ray moves torch tensors by default; torch is not installed")

from ray.cluster_utils import Cluster  # noqa: E402

import rdt.ray  # noqa: E402
from conftest import BUILTINS  # noqa: E402
from ray_actors import Worker, make_value, summary  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif("tcp" not in BUILTINS, reason="the runtime lists no tcp transport")]


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 10},
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"node_b": 10})
    cluster.wait_for_nodes()
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}}
    ray.init(address=cluster.address, runtime_env=rdt.ray.runtime_env(env), logging_level="WARNING")
    rdt.ray.register()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def on(node):
    a = Worker.options(resources={node: 1}).remote()
    ray.get(a.ready.remote(), timeout=120)
    return a


def test_tcp_between_nodes_cma_or_shm_inside_one(two_nodes):
    src, far, near = on("node_a"), on("node_b"), on("node_a")
    assert ray.get(src.node.remote()) != ray.get(far.node.remote())
    assert ray.get(src.node.remote()) == ray.get(near.node.remote())
    size = 16 << 20
    ref = src.make.remote(f"bytes:{size}")
    want = summary(make_value(f"bytes:{size}"))

    assert ray.get(far.consume.remote(ref), timeout=120) == want
    moved = ray.get(far.bytes_by_transport.remote())
    assert moved.get("tcp", 0) >= size and not moved.get("cma") and not moved.get("shm"), moved
    # The receiving runtime advertises TCP at its node's IP with the
    # cluster's token, never the token itself in its address.
    address = ray.get(far.address.remote())
    assert "tcp://" in address and rdt.ray._PROCESS.token() not in address

    assert ray.get(near.consume.remote(ref), timeout=120) == want
    moved = ray.get(near.bytes_by_transport.remote())
    assert not moved.get("tcp") and moved.get("cma", 0) + moved.get("shm", 0) >= size, moved

    # The driver runs on the head node (node_a's).
    assert summary(ray.get(ref, timeout=120)) == want
    del ref
    ray.get(src.ready.remote())


def test_a_node_to_node_object_is_freed_with_its_ref(two_nodes):
    src, far = on("node_a"), on("node_b")
    ref = src.make.remote("500x500", 2)
    assert ray.get(far.consume.remote(ref), timeout=120) == summary(make_value("500x500", 2))
    del ref
    from ray._common.test_utils import wait_for_condition
    wait_for_condition(lambda: ray.get(src.stats.remote())["objects"] == 0, timeout=30)
    wait_for_condition(lambda: ray.get(far.stats.remote())["borrows"] == 0, timeout=30)
