"""The process's runtime for Ray's transfers, made on first use, and the
cluster token the driver chose."""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Tuple

import rdt

from .._process import PROCESS as _RDT_PROCESS
from .._receive import ReceiveCache
from ._config import (_CACHE_ENV, _CONFIG_ENV, _DEFAULT_CACHE_BYTES, _DEFAULT_CONFIG, _TOKEN_ENV, _cache_limit,
                      _decode_config)
from ._ray_api import ray


class _Process:
    """This process's runtime for Ray's transfers, made on first use, and the
    token the driver chose (workers read theirs from the environment)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtime: Optional[rdt.Runtime] = None
        self._node: Optional[str] = None  # the Ray node the runtime was made on
        self._session: Any = None  # the Ray connection _node was read from
        self._config: Optional[Tuple[str, Any]] = None
        self._token: Optional[str] = None
        self._cache: Optional[ReceiveCache] = None

    def receive_cache(self) -> ReceiveCache:
        """The process's cache of dropped receive buffers (rdt's own, which
        get uses too), bounded on first use here as runtime_env() asked."""
        cache = self._cache
        if cache is None:
            with self._lock:
                if self._cache is None:
                    raw = os.environ.get(_CACHE_ENV)
                    limit = _DEFAULT_CACHE_BYTES if raw is None else _cache_limit(raw, "$" + _CACHE_ENV)
                    shared = _RDT_PROCESS.receive_cache()
                    shared.set_limit(limit)
                    self._cache = shared
                cache = self._cache
        return cache

    def config(self) -> Tuple[str, Tuple[str, ...], str, Optional[str]]:
        """The registration runtime_env() described, parsed once per value."""
        raw = os.environ.get(_CONFIG_ENV) or _DEFAULT_CONFIG
        cached = self._config
        if cached is not None and cached[0] == raw:
            return cached[1]
        parsed = _decode_config(raw)
        self._config = (raw, parsed)
        return parsed

    def token(self) -> Optional[str]:
        return self._token or os.environ.get(_TOKEN_ENV) or None

    def set_token(self, token: str) -> None:
        with self._lock:
            self._token = token

    def runtime(self) -> rdt.Runtime:
        rt = self._runtime
        if rt is not None and not rt.closed and self._session is _ray_session():
            return rt
        node = _node_id()
        with self._lock:
            old = None
            if self._runtime is None or self._runtime.closed or self._node != node:
                # A driver that joins another Ray session is on another
                # node: its host identity changes with it.
                old, self._runtime, self._node = self._runtime, self._create(node), node
            self._session = _ray_session()
        if old is not None:
            old.close()
        return self._runtime

    def _create(self, node: Optional[str]) -> rdt.Runtime:
        options: Dict[str, Any] = {"name": f"ray-{os.getpid()}"}
        if node is not None:
            # Each Ray node counts as a host: runtimes of one node share cma
            # and shm, runtimes of different nodes use tcp (also two nodes of
            # one machine, as Ray's own tests make them).
            options["host_id"] = "ray-node-" + node
            token = self._token or os.environ.get(_TOKEN_ENV)
            if token:
                ip = ray.util.get_node_ip_address()
                host = f"[{ip}]" if ":" in ip else ip
                options.update(listen_tcp=f"{host}:0", advertise_host=ip, auth_token=token)
        return rdt.Runtime(**options)


def _ray_session() -> Any:
    """This process's connection to Ray (None when not connected): the node
    is read again only when it changes (a driver's ray.shutdown and
    ray.init), since reading it costs microseconds on every transfer."""
    worker = ray._private.worker.global_worker
    return getattr(worker, "core_worker", None) if worker.connected else None


def _node_id() -> Optional[str]:
    """This process's Ray node, or None outside a Ray session."""
    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


_PROCESS = _Process()


def runtime() -> rdt.Runtime:
    """This process's rdt runtime for Ray's transfers (made on first use; in
    workers by :func:`setup`). Its ``stats()`` and ``transports()`` count what
    Ray moved over rdt here."""
    return _PROCESS.runtime()


def _config() -> Tuple[str, Tuple[str, ...], str, Optional[str]]:
    return _PROCESS.config()


def _hint_unreachable() -> str:
    if _PROCESS.token():
        return ""
    return (" — to reach runtimes on other Ray nodes, every process needs the cluster's token: "
            "ray.init(runtime_env=rdt.ray.runtime_env()) (see docs/ray.md)")
