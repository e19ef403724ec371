"""Prometheus metrics of an rdt runtime.

``rdt.metrics.register()`` adds a collector to a ``prometheus_client``
registry (the global one by default); every scrape then reads the
runtime's counters and fetch latency histograms afresh:

    import prometheus_client, rdt.metrics
    rdt.metrics.register()
    prometheus_client.start_http_server(9400)

Families (see docs/metrics.md):

- ``rdt_fetch_seconds`` (histogram, labels ``transport``, ``size_class``):
  from the start of a fetch to the end of each object's transfer, by the
  transport that moved it and the object's size class (its upper bound:
  ``4KiB`` ... ``256MiB``, ``+Inf``); buckets of 2^k microseconds.
- ``rdt_fetch_failures_total`` (``transport``): failed fetches over it.
- ``rdt_write_seconds`` and ``rdt_write_failures_total``: the same for
  writes this runtime made into exposed objects.
- ``rdt_bytes_total`` (``transport``, ``direction`` =
  ``received``|``sent``|``written``).
- ``rdt_transfers_total`` and ``rdt_transport_writes_total`` (``transport``,
  ``result`` = ``completed``|``failed``) and ``rdt_sends_total``
  (``transport``).
- The runtime's own: ``rdt_objects``, ``rdt_objects_freed_total``,
  ``rdt_refs``, ``rdt_borrows``, ``rdt_borrowed_objects``,
  ``rdt_refs_in_transit``, ``rdt_leases_expired_total``,
  ``rdt_fetches_active``, ``rdt_local_copies_total``, ``rdt_peers``,
  ``rdt_peers_lost_total``.

``prometheus_client`` is optional: it is imported when a collector is made.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from . import _lib
from ._default import DEFAULT
from ._errors import ClosedError
from ._runtime import Runtime

__all__ = ["RdtCollector", "register", "SIZE_CLASS_LABELS", "LATENCY_BUCKET_BOUNDS"]


def _size_label(c: int) -> str:
    bound = _lib.fetch_size_class_max_bytes(c)
    if bound is None:
        return "+Inf"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if bound >= 1 << shift:
            return f"{bound >> shift}{unit}"
    return f"{bound}B"


# The size_class label of each class: its upper bound ("4KiB", ..., "+Inf").
SIZE_CLASS_LABELS = tuple(_size_label(c) for c in range(_lib.FETCH_SIZE_CLASSES))
# The upper bound of each latency bucket, in seconds (the last: infinity).
LATENCY_BUCKET_BOUNDS = tuple(
    float("inf") if us is None else us / 1e6
    for us in (_lib.fetch_latency_bucket_max_us(b) for b in range(_lib.FETCH_LATENCY_BUCKETS)))

# The runtime's counters (Runtime.stats) as families: (stats key, family
# name, gauge?, help).
_RUNTIME_FAMILIES = (
    ("objects", "rdt_objects", True, "Objects this runtime owns that are not yet freed."),
    ("objects_freed", "rdt_objects_freed", False, "Objects this runtime owned and freed."),
    ("refs", "rdt_refs", True, "Live ref handles of this runtime."),
    ("borrows", "rdt_borrows", True, "Borrows other runtimes hold on this runtime's objects."),
    ("borrowed_objects", "rdt_borrowed_objects", True, "Other runtimes' objects this runtime holds refs to."),
    ("refs_in_transit", "rdt_refs_in_transit", True, "Serialized refs within their lease."),
    ("leases_expired", "rdt_leases_expired", False, "Serialized refs never deserialized within their lease."),
    ("fetches_active", "rdt_fetches_active", True, "Fetches started and not yet freed."),
    ("local_copies", "rdt_local_copies", False, "Fetches of this runtime's own objects, copied directly."),
    ("peers", "rdt_peers", True, "Runtimes this runtime is connected to."),
    ("peers_lost", "rdt_peers_lost", False, "Connections to peers that ended without their closing notice."),
    ("writes_completed", "rdt_writes_completed", False, "Writes into other runtimes' exposed objects that landed."),
    ("writes_failed", "rdt_writes_failed", False, "Writes into other runtimes' exposed objects that failed."),
    ("bytes_written", "rdt_bytes_written", False, "Bytes written into other runtimes' exposed objects."),
    ("writes_open", "rdt_writes_open", True, "Writes into this runtime's exposed objects admitted and not ended."),
    ("views_open", "rdt_views_open", True, "Views mapping other runtimes' objects, not released."),
    ("bytes_viewed", "rdt_bytes_viewed", True, "Bytes the open views map."),
)


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core
        import prometheus_client.utils
    except ImportError as e:
        raise ImportError("rdt.metrics needs the prometheus_client package: pip install prometheus_client") from e
    return prometheus_client


class RdtCollector:
    """A ``prometheus_client`` collector over one runtime: ``runtime``, or
    with None the process's default runtime as it is at each scrape (a
    scrape never creates one; before it exists, or after it was closed, the
    families have no samples)."""

    def __init__(self, runtime: Optional[Runtime] = None):
        self._prom = _prometheus()
        self._runtime = runtime

    def _target(self) -> Optional[Runtime]:
        if self._runtime is not None:
            return self._runtime
        return DEFAULT.runtime

    def _families(self) -> Dict[str, Any]:
        core = self._prom.core

        def latency(verb: str, plural: str) -> Any:  # a get's or a write's histogram and failures
            return (core.HistogramMetricFamily(
                f"rdt_{verb}_seconds", f"{verb.capitalize()} latency: from the start of a {verb} to the end of each "
                "object's transfer, by the transport that moved it and the object's size class (its upper bound).",
                labels=["transport", "size_class"]),
                core.CounterMetricFamily(f"rdt_{verb}_failures", f"{plural} that failed after their transport was "
                                         "chosen.", labels=["transport"]))

        fetch_seconds, fetch_failures = latency("fetch", "Fetches")
        write_seconds, write_failures = latency("write", "Writes")
        fams: Dict[str, Any] = {
            "fetch_seconds": fetch_seconds,
            "failures": fetch_failures,
            "write_seconds": write_seconds,
            "write_failures": write_failures,
            "transport_writes": core.CounterMetricFamily(
                "rdt_transport_writes", "Writes each transport ended for this runtime as writer.",
                labels=["transport", "result"]),
            "bytes": core.CounterMetricFamily(
                "rdt_bytes", "Bytes moved by each transport: received as destination, sent by a two-sided "
                "transport's send as source.", labels=["transport", "direction"]),
            "transfers": core.CounterMetricFamily(
                "rdt_transfers", "Transfers each transport ended as destination.", labels=["transport", "result"]),
            "sends": core.CounterMetricFamily(
                "rdt_sends", "Sends a two-sided transport served as source.", labels=["transport"]),
        }
        for key, name, gauge, doc in _RUNTIME_FAMILIES:
            kind = core.GaugeMetricFamily if gauge else core.CounterMetricFamily
            fams[key] = kind(name, doc)
        return fams

    def describe(self) -> Iterator[Any]:
        """The families without samples: registering reads no runtime."""
        return iter(self._families().values())

    def collect(self) -> Iterator[Any]:
        fams = self._families()
        rt = self._target()
        if rt is not None and not rt.closed:
            try:
                self._fill(fams, rt)
            except ClosedError:  # closed during the scrape: nothing to report
                fams = self._families()
        return iter(fams.values())

    def _fill(self, fams: Dict[str, Any], rt: Runtime) -> None:
        fmt = self._prom.utils.floatToGoString
        bounds = [fmt(b) for b in LATENCY_BUCKET_BOUNDS]
        failures: Dict[str, Dict[str, int]] = {"get": {}, "write": {}}
        for h in rt.fetch_histograms():
            cumulative, running = [], 0
            for le, n in zip(bounds, h["buckets"]):
                running += n
                cumulative.append((le, running))
            seconds = "write_seconds" if h["direction"] == "write" else "fetch_seconds"
            fams[seconds].add_metric([h["transport"], SIZE_CLASS_LABELS[h["size_class"]]],
                                     buckets=cumulative, sum_value=h["sum_ns"] / 1e9)
            failed = failures[h["direction"]]
            failed[h["transport"]] = failed.get(h["transport"], 0) + h["failures"]
        for t in rt.transports():
            name = t["name"]
            fams["failures"].add_metric([name], failures["get"].get(name, 0))
            fams["bytes"].add_metric([name, "received"], t["bytes_received"])
            fams["bytes"].add_metric([name, "sent"], t["bytes_sent"])
            fams["transfers"].add_metric([name, "completed"], t["transfers_completed"])
            fams["transfers"].add_metric([name, "failed"], t["transfers_failed"])
            if t["writes"]:
                fams["write_failures"].add_metric([name], failures["write"].get(name, 0))
                fams["bytes"].add_metric([name, "written"], t["bytes_written"])
                fams["transport_writes"].add_metric([name, "completed"], t["writes_completed"])
                fams["transport_writes"].add_metric([name, "failed"], t["writes_failed"])
            fams["sends"].add_metric([name], t["sends_completed"])
        stats = rt.stats()
        for key, _, _, _ in _RUNTIME_FAMILIES:
            fams[key].add_metric([], stats[key])


def register(runtime: Optional[Runtime] = None, registry: Any = None) -> RdtCollector:
    """Makes an RdtCollector over ``runtime`` (None: the process's default
    runtime at each scrape) and registers it with ``registry`` (None:
    ``prometheus_client.REGISTRY``). Returns the collector, which
    ``registry.unregister`` removes again. Raises ImportError naming
    ``pip install prometheus_client`` when that package is missing."""
    collector = RdtCollector(runtime)
    (registry if registry is not None else collector._prom.REGISTRY).register(collector)
    return collector
