"""rdt inside a real Ray cluster across bed hosts: the head on h0, worker
nodes on h1 and h2, each started with `ray start` in its host's namespaces,
and the driver on the head's host (tests/hosts/ray_driver.py). Between
hosts rdt moves the bytes over tcp with the cluster's token; within a host,
over cma or shm. Then the failures: a link cut during a transfer, a worker
node killed, a slow link under Ray's fetch timeout."""

import time

import pytest

pytest.importorskip("ray", reason="Ray is not installed (tests/python/requirements.txt pins it)")
pytest.importorskip("torch", reason="rdt.ray moves torch tensors by default; torch is not installed")

from raycluster import RayCluster  # noqa: E402

MIB = 1 << 20
# rdt.ray's runtimes keep the default peer timeout (5 s); Ray marks a node
# dead only after several missed health checks (about 15 s and more), so a
# cut of 8 s fails rdt's transfer and leaves Ray's nodes alive.
RDT_PEER_TIMEOUT = 5.0

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def ray_bed(make_bed):
    def make(rate=None, env=None) -> RayCluster:
        c = RayCluster(make_bed(3, rate=rate), env)
        c.start_driver()
        return c
    return make


def test_tcp_between_hosts_cma_or_shm_within_one(ray_bed):
    c = ray_bed()
    for name, host in (("src", "h1"), ("far", "h2"), ("near", "h1")):
        c.call("actor", name=name, host=host)
    assert c.call("node", actor="src")["node"] == c.call("node", actor="near")["node"]
    assert c.call("node", actor="src")["node"] != c.call("node", actor="far")["node"]
    size = 16 * MIB
    c.call("make", name="x", actor="src", kind=f"bytes:{size}", seed=3)

    got = c.call("consume", actor="far", ref="x")
    assert got["same"], got
    moved = c.call("moved", actor="far")["moved"]
    assert moved.get("tcp", 0) >= size and not moved.get("cma") and not moved.get("shm"), moved
    where = c.call("address", actor="far")
    assert "tcp://198.18.0.3:" in where["address"] and where["token"] not in where["address"], where

    got = c.call("consume", actor="near", ref="x")
    assert got["same"], got
    moved = c.call("moved", actor="near")["moved"]
    assert not moved.get("tcp") and moved.get("cma", 0) + moved.get("shm", 0) >= size, moved


def test_a_link_cut_during_a_transfer_fails_it_and_both_actors_live_on(ray_bed):
    c = ray_bed(rate="200mbit")
    c.call("actor", name="src", host="h1")
    c.call("actor", name="far", host="h2")
    c.call("make", name="x", actor="src", kind=f"bytes:{64 * MIB}", seed=4)  # 2.7 s over the link

    c.driver.start("consume", actor="far", ref="x")
    c.bed.wait_traffic(c.bed.hosts[2], 8 << 20)  # rdt's bytes are on their way
    c.bed.link_down(c.bed.hosts[2])
    time.sleep(RDT_PEER_TIMEOUT + 3)
    c.bed.link_up(c.bed.hosts[2])
    result = c.driver.read(180)
    print(f"the consume after the cut: {result}")
    # rdt's own error, through Ray's task error: the owner went away.
    assert not result["ok"] and result["error"] == "RayTaskError(PeerUnavailableError)", result
    assert "went away during the transfer" in result["message"], result

    # Both actors live on, and the next transfer between them works.
    assert c.call("alive", actor="far")["alive"] and c.call("alive", actor="src")["alive"]
    c.call("make", name="y", actor="src", kind=f"bytes:{MIB}", seed=5)
    again = c.ask("consume", actor="far", ref="y")
    assert again["ok"] and again["same"], again


def test_a_killed_worker_node_fails_transfers_from_it_and_the_rest_goes_on(ray_bed):
    c = ray_bed()
    c.call("actor", name="src", host="h1")
    c.call("actor", name="doomed", host="h2")
    c.call("actor", name="reader", host="h0")
    c.call("make", name="lost", actor="doomed", kind=f"bytes:{4 * MIB}", seed=6)
    c.call("make", name="kept", actor="src", kind=f"bytes:{4 * MIB}", seed=7)
    assert c.call("consume", actor="reader", ref="kept")["same"]

    c.bed.hosts[2].kill_all()
    t0 = time.monotonic()
    result = c.ask("consume", actor="reader", ref="lost", deadline=120)
    print(f"the consume of an object on the killed node, {time.monotonic() - t0:.1f} s: {result}")
    # A clear error at once, not a hang until a timeout.
    assert not result["ok"] and result["error"] == "RayTaskError(PeerUnavailableError)", result
    assert result["seconds"] < 30, result
    assert not c.call("alive", actor="doomed", deadline=60)["alive"]

    # The surviving hosts go on: the same source, the same reader.
    c.call("make", name="after", actor="src", kind=f"bytes:{4 * MIB}", seed=8)
    again = c.ask("consume", actor="reader", ref="after")
    assert again["ok"] and again["same"], again


def test_a_slow_link_under_rays_fetch_timeout(ray_bed):
    c = ray_bed(env={"RAY_rdt_fetch_fail_timeout_milliseconds": "4000"})
    c.call("actor", name="src", host="h1")
    c.call("actor", name="far", host="h2")
    c.bed.set_rate(c.bed.hosts[2], "100mbit")

    # 16 MiB: 1.3 s over the slow link, within the fetch timeout.
    c.call("make", name="small", actor="src", kind=f"bytes:{16 * MIB}", seed=9)
    ok = c.ask("consume", actor="far", ref="small")
    assert ok["ok"] and ok["same"], ok

    # 64 MiB: 5.4 s, past it. Ray aborts the fetch; both actors live on.
    c.call("make", name="big", actor="src", kind=f"bytes:{64 * MIB}", seed=10)
    late = c.ask("consume", actor="far", ref="big")
    print(f"the consume past Ray's fetch timeout: {late}")
    assert not late["ok"] and late["error"] == "RayTaskError(TimeoutError)", late
    assert c.call("alive", actor="far")["alive"] and c.call("alive", actor="src")["alive"]

    c.bed.set_rate(c.bed.hosts[2], None)
    c.call("make", name="again", actor="src", kind=f"bytes:{64 * MIB}", seed=11)
    again = c.ask("consume", actor="far", ref="again")
    assert again["ok"] and again["same"], again
