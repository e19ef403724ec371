"""How the transport is registered: with Ray in this process (register,
and setup in workers), and in every worker through runtime_env."""

from __future__ import annotations

import os
import secrets
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple

import rdt

from ._config import (_CACHE_ENV, _CONFIG_ENV, _NUMPY_WARNING, _SETUP_HOOK, _TOKEN_ENV, _cache_limit, _data_type,
                      _devices_of, _encode_config, _framework_of)
from ._ray_api import ray, ray_rdt as _ray_rdt
from ._runtime import _PROCESS, _config, runtime
from ._transport import RdtTensorTransport


def _register_with_ray(name: str, devices: Tuple[str, ...], framework: str) -> None:
    name = name.upper()
    known = _ray_rdt.transport_manager_info.get(name)
    if known is not None:
        if (known.transport_manager_class is RdtTensorTransport and tuple(known.devices) == devices
                and _framework_of(known.data_type) == framework):
            return  # already registered, the same way (the setup hook, then the driver's own task)
        raise rdt.AlreadyExistsError(f"Ray already has a tensor transport named {name!r}, registered differently "
                                     f"({known.transport_manager_class.__name__}, devices {list(known.devices)})",
                                     rdt.AlreadyExistsError.status)
    ray.experimental.register_tensor_transport(name, list(devices), RdtTensorTransport, _data_type(framework))


def register(name: str = "RDT", devices: Sequence[str] = ("cpu", "cuda"), data_type: Any = None) -> None:
    """Registers rdt with Ray as the tensor transport ``name`` in this
    process. Call it in the driver, after ``ray.init`` and before the actors
    that use it are created; give it the arguments given to
    :func:`runtime_env`, which registers it in every worker.

    ``devices`` are device types ("cpu", "cuda"). ``data_type`` is the type
    of the values Ray hands rdt: torch tensors (``None``, the default) or
    ``numpy.ndarray``, which warns: Ray then serializes every numpy array of
    those processes through its transport hook (see docs/ray.md).
    Registering again the same way does nothing."""
    framework = _framework_of(data_type)
    devs = _devices_of(devices)
    if framework == "numpy":
        warnings.warn(_NUMPY_WARNING, UserWarning, stacklevel=2)
    _register_with_ray(name, devs, framework)


def setup() -> None:
    """Ray's ``worker_process_setup_hook`` for rdt (``"rdt.ray.setup"``, set
    by :func:`runtime_env`): registers the transport in this worker as the
    driver described it, and starts the worker's runtime now, so that
    neither an early ``ray.put(..., _tensor_transport=...)`` nor a restarted
    actor finds it missing, and the first transfer pays no start-up."""
    name, devices, framework, _ = _config()
    _register_with_ray(name, devices, framework)
    runtime()


def runtime_env(env: Optional[Dict[str, Any]] = None, *, name: str = "RDT",
                devices: Sequence[str] = ("cpu", "cuda"), data_type: Any = None,
                token: Optional[str] = None, transport: Optional[str] = None,
                receive_cache: Optional[int] = None) -> Dict[str, Any]:
    """A Ray ``runtime_env`` (``env`` plus rdt's part) that registers rdt in
    every worker (:func:`setup` as ``worker_process_setup_hook``) and gives
    every worker the cluster's token. Pass it to ``ray.init`` (or a job's,
    or an actor's, runtime_env).

    ``token`` authenticates the runtimes of the cluster to one another over
    TCP; None takes ``$RDT_RAY_AUTH_TOKEN``, else makes a random one for
    this driver and its workers. It travels as an environment variable of
    the job: whoever may read the job's runtime_env may also run code in its
    workers, so it protects nothing they could not reach anyway; rdt never
    logs it. Runtimes with different tokens do not connect.

    ``transport`` pins the rdt transport that moves the objects these
    processes make ("cma", "shm", "tcp", ...); None lets each transfer
    take the best one. A runtime_env given to one actor may pin another.

    ``receive_cache`` bounds the bytes of dropped CPU receive buffers (of
    4 MiB and more) each process keeps to receive into again; None keeps
    1 GiB (or ``$RDT_RAY_RECEIVE_CACHE_BYTES``), 0 keeps none."""
    framework = _framework_of(data_type)
    cache = None
    if receive_cache is not None:
        cache = str(_cache_limit(str(receive_cache), "receive_cache"))
    config = _encode_config(name, _devices_of(devices), framework, transport)
    out = dict(env or {})
    hook = out.get("worker_process_setup_hook")
    if hook not in (None, _SETUP_HOOK):
        raise rdt.InvalidArgumentError(f"runtime_env already has a worker_process_setup_hook ({hook!r}); call "
                                       "rdt.ray.setup() from yours instead and keep the env_vars rdt adds")
    out["worker_process_setup_hook"] = _SETUP_HOOK
    tok = token or os.environ.get(_TOKEN_ENV) or _PROCESS.token()
    if not tok:
        tok = secrets.token_urlsafe(32)
    _PROCESS.set_token(tok)
    env_vars = dict(out.get("env_vars") or {})
    env_vars[_CONFIG_ENV] = config
    env_vars[_TOKEN_ENV] = tok
    if cache is not None:
        env_vars[_CACHE_ENV] = cache
    out["env_vars"] = env_vars
    return out
