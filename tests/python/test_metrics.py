"""rdt.metrics: after a known set of transfers from another process, the
Prometheus samples are exact (histogram counts per transport and size
class, cumulative buckets, bytes, objects), and the exposition parses."""

import math

import numpy as np
import pytest

import rdt
import workers
from rdt import _lib

prometheus_client = pytest.importorskip(
    "prometheus_client", reason="prometheus_client is not installed (tests/python/requirements.txt pins it)")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import rdt.metrics  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PLAN = [("shm", 1024, 3), ("tcp", 100 * 1024, 2)]  # 1 KiB: class 0; 100 KiB: class 2


@pytest.fixture
def fetched(child):
    """A runtime of this process that fetched PLAN's objects from a child
    process, once each, and holds two objects of its own."""
    c = child(workers.serve_sized, PLAN)
    raws = c.recv()
    rt = rdt.Runtime("metrics-reader")
    i = 0
    for transport, nbytes, count in PLAN:
        for k in range(count):
            ref = rt.deserialize(raws[i])
            got = rt.get(ref)
            assert got.nbytes == nbytes and int(got[0]) == k
            ref.close()
            i += 1
    own = [rt.put(np.arange(10.0)), rt.put(np.arange(3))]
    yield rt
    for r in own:
        r.close()
    rt.close()
    c.stop()


def test_fetch_histograms_are_exact(fetched):
    hs = fetched.fetch_histograms()
    assert [(h["transport"], h["size_class"], h["count"], h["bytes"], h["failures"]) for h in hs] == [
        ("shm", 0, 3, 3 * 1024, 0), ("tcp", 2, 2, 2 * 100 * 1024, 0)]
    for h in hs:
        assert len(h["buckets"]) == _lib.FETCH_LATENCY_BUCKETS
        assert sum(h["buckets"]) == h["count"]
        assert h["sum_ns"] > 0
    assert hs[0]["size_class_max_bytes"] == 4096
    assert hs[1]["size_class_max_bytes"] == 1 << 20


def test_collector_samples_are_exact(fetched):
    registry = prometheus_client.CollectorRegistry()
    rdt.metrics.register(fetched, registry)
    value = registry.get_sample_value
    hs = {(h["transport"], h["size_class"]): h for h in fetched.fetch_histograms()}
    for (transport, size_class, count, nbytes) in [("shm", "4KiB", 3, 3 * 1024), ("tcp", "1MiB", 2, 2 * 100 * 1024)]:
        labels = {"transport": transport, "size_class": size_class}
        assert value("rdt_fetch_seconds_count", labels) == count
        h = hs[(transport, rdt.metrics.SIZE_CLASS_LABELS.index(size_class))]
        assert value("rdt_fetch_seconds_sum", labels) == pytest.approx(h["sum_ns"] / 1e9)
        buckets = [value("rdt_fetch_seconds_bucket", dict(labels, le=prometheus_client.utils.floatToGoString(b)))
                   for b in rdt.metrics.LATENCY_BUCKET_BOUNDS]
        assert None not in buckets
        assert buckets == sorted(buckets), "cumulative buckets never fall"
        assert buckets[-1] == count, "+Inf holds every fetch"
        running = 0
        for b, n in enumerate(h["buckets"]):
            running += n
            assert buckets[b] == running
        assert value("rdt_bytes_total", {"transport": transport, "direction": "received"}) == nbytes
        assert value("rdt_transfers_total", {"transport": transport, "result": "completed"}) == count
        assert value("rdt_fetch_failures_total", {"transport": transport}) == 0
    assert value("rdt_fetch_seconds_count", {"transport": "cma", "size_class": "4KiB"}) is None
    assert value("rdt_bytes_total", {"transport": "cma", "direction": "received"}) == 0
    assert value("rdt_objects") == 2
    assert value("rdt_objects_freed_total") == 0
    assert value("rdt_refs") == 2
    assert value("rdt_fetches_active") == 0
    assert value("rdt_peers") == 1


def test_exposition_parses(fetched):
    registry = prometheus_client.CollectorRegistry()
    rdt.metrics.register(fetched, registry)
    text = prometheus_client.generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["rdt_fetch_seconds"].type == "histogram"
    assert families["rdt_bytes"].type == "counter"
    assert families["rdt_objects"].type == "gauge"
    inf = [s for s in families["rdt_fetch_seconds"].samples
           if s.name == "rdt_fetch_seconds_bucket" and math.isinf(float(s.labels["le"]))]
    assert sorted((s.labels["transport"], s.value) for s in inf) == [("shm", 3), ("tcp", 2)]


def test_default_runtime_is_read_at_each_scrape_and_never_created():
    registry = prometheus_client.CollectorRegistry()
    collector = rdt.metrics.register(registry=registry)
    from rdt._default import DEFAULT
    had = DEFAULT.runtime
    try:
        DEFAULT.runtime = None
        assert registry.get_sample_value("rdt_objects") is None, "no default runtime: no samples"
        assert DEFAULT.runtime is None, "a scrape creates no runtime"
        rt = rdt.Runtime("metrics-default")
        DEFAULT.runtime = rt
        ref = rt.put(np.arange(4.0))
        assert registry.get_sample_value("rdt_objects") == 1
        ref.close()
        rt.close()
        assert registry.get_sample_value("rdt_objects") is None, "a closed runtime: no samples"
    finally:
        DEFAULT.runtime = had
        registry.unregister(collector)


def test_missing_prometheus_client_names_the_install(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name.startswith("prometheus_client"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", refuse)
    with pytest.raises(ImportError, match="pip install prometheus_client"):
        rdt.metrics.register()


def test_writes_are_counted_like_gets(child):
    """A write is a transfer like a get: counted per transport (its own
    counters), in the histograms under direction "write", and in the
    collector's write families; a failed write counts as a failure."""
    c = child(workers.exposer, ["shm", "tcp"], None)
    raws = c.recv()
    rt = rdt.Runtime("metrics-writer")
    try:
        refs = {t: rt.deserialize(raws[t]) for t in ("shm", "tcp")}
        for t, times in (("shm", 2), ("tcp", 1)):
            for k in range(times):
                rt.write(refs[t], np.full(4096, k + 1, np.uint8), tag=k + 1, timeout=30)
                c.send(("notice", t))
                ok, tag, _, got = c.recv()
                assert ok and tag == k + 1 and (got == k + 1).all()
        with pytest.raises(rdt.InvalidArgumentError):
            rt.write(refs["shm"], np.zeros(8192, np.uint8), timeout=30)  # too large: refused before any transport
        listed = {t["name"]: t for t in rt.transports()}
        assert [(listed[t]["writes_completed"], listed[t]["bytes_written"], listed[t]["writes_failed"])
                for t in ("shm", "tcp")] == [(2, 2 * 4096, 0), (1, 4096, 0)]
        assert listed["shm"]["transfers_completed"] == 0, "a write is no get"
        hs = [(h["transport"], h["direction"], h["size_class"], h["count"], h["bytes"]) for h in rt.fetch_histograms()]
        assert hs == [("shm", "write", 0, 2, 2 * 4096), ("tcp", "write", 0, 1, 4096)]
        registry = prometheus_client.CollectorRegistry()
        rdt.metrics.register(rt, registry)
        value = registry.get_sample_value
        assert value("rdt_write_seconds_count", {"transport": "shm", "size_class": "4KiB"}) == 2
        assert value("rdt_fetch_seconds_count", {"transport": "shm", "size_class": "4KiB"}) is None
        assert value("rdt_bytes_total", {"transport": "tcp", "direction": "written"}) == 4096
        assert value("rdt_transport_writes_total", {"transport": "tcp", "result": "completed"}) == 1
        for r in refs.values():
            r.close()
    finally:
        rt.close()
        c.send("stop")
        c.stop()
