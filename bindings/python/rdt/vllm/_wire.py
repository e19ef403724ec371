"""What the trainer and vLLM's workers tell each other: the init and update
infos of the "librdt" backend, checked as input from outside, and the error
a failed sync raises. Everything here is JSON-safe, so vLLM's HTTP routes
carry it without its insecure-serialization switch."""

from __future__ import annotations

import base64
import binascii
import contextlib
import gc
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Iterator, List, Optional

from vllm.distributed.weight_transfer.base import (TrainerInitInfo, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)

import rdt

from . import BACKEND, register

PROTOCOL = 1
"""The wire's version; a worker refuses an init info of another."""

# Bounds on what an update may announce, checked before anything is
# allocated: a model of a million tensors, names of 4 KiB, a ref's bytes of
# 64 MiB (a serialized ref grows by tens of bytes per tensor).
MAX_REFS = 65536
MAX_TENSORS = 1 << 20
MAX_NAME = 4096
MAX_REF_CHARS = 64 << 20
MAX_DIMS = 8
# The dtypes a packed group may have (torch's names).
DTYPES = frozenset(("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                    "float8_e4m3fn", "float8_e5m2"))


class WeightSyncError(rdt.RdtError):
    """A weight sync failed: the trainer went away, a deadline passed, a
    worker refused the update. ``__cause__`` is the error underneath (an
    rdt error, or vLLM's); the model keeps serving, and the next sync
    starts afresh."""


def _positive_seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}")
    return float(value)


def _optional_str(value: object, what: str) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what} must be a string or None, not {type(value).__name__}")
    return value


@dataclass
class LibrdtInitInfo(WeightTransferInitInfo):
    """What a worker needs before the first update: the wire's version, the
    deadline of each update call, the job's token (where the trainer's
    runtime takes tcp connections with one) and a transport to force
    (None: rdt picks the best). ``views``: a worker on the trainer's host
    maps the trainer's one staged copy of each bucket and processes layers
    straight from it, rather than copying the bytes in (every replica on
    the host shares that copy); False always copies."""

    protocol: int = PROTOCOL
    timeout_s: float = 120.0
    auth_token: Optional[str] = None
    transport: Optional[str] = None
    views: bool = False

    def __post_init__(self) -> None:
        if self.protocol != PROTOCOL:
            raise ValueError(f"the trainer speaks librdt protocol {self.protocol!r}; this worker speaks "
                             f"{PROTOCOL}: install the same rdt on both sides")
        self.timeout_s = _positive_seconds(self.timeout_s, "timeout_s")
        _optional_str(self.auth_token, "auth_token")
        _optional_str(self.transport, "transport")
        if not isinstance(self.views, bool):
            raise ValueError(f"views must be a bool, not {self.views!r}")


@dataclass
class LibrdtUpdateInfo(WeightTransferUpdateInfo):
    """One bucket of a sync: ``refs[i]`` is the base64 of a serialized rdt
    ref (``ObjectRef.serialize()``) to a list of tensors, ``names[i]`` their
    names in put order; ``packs[i]`` (empty, or one list per ref) the
    groups of small tensors packed into the ref's last tensors, one 1-D
    tensor per group: ``{"dtype": name, "names": [...], "shapes": [...]}``,
    members back to back in order. ``version`` counts the trainer's syncs.
    ``abandon`` (no refs then) is the trainer giving the step up: the worker
    refuses it, which closes vLLM's session without the version."""

    version: int
    refs: List[str]
    names: List[List[str]]
    packs: List[List[Dict[str, Any]]] = field(default_factory=list)
    abandon: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise ValueError(f"version must be a non-negative int, not {self.version!r}")
        if not isinstance(self.refs, list) or not isinstance(self.names, list):
            raise ValueError("refs and names must be lists")
        if len(self.refs) != len(self.names):
            raise ValueError(f"{len(self.refs)} refs but {len(self.names)} name lists: one list per ref")
        if not isinstance(self.abandon, bool) or (self.abandon and self.refs):
            raise ValueError("abandon must be a bool, and an abandoning update carries no refs")
        if not self.abandon and not self.refs:
            raise ValueError("an update carries at least one ref")
        if len(self.refs) > MAX_REFS:
            raise ValueError(f"{len(self.refs)} refs in one update: at most {MAX_REFS}")
        if not isinstance(self.packs, list) or (self.packs and len(self.packs) != len(self.refs)):
            raise ValueError("packs must be a list with one list of groups per ref, or empty")
        total = 0
        for i, (ref, names) in enumerate(zip(self.refs, self.names)):
            if not isinstance(ref, str) or not ref or len(ref) > MAX_REF_CHARS:
                raise ValueError(f"refs[{i}] must be the base64 of a serialized ref, at most {MAX_REF_CHARS} "
                                 "characters")
            packs = self.packs[i] if self.packs else []
            if not isinstance(names, list) or not isinstance(packs, list) or not (names or packs):
                raise ValueError(f"names[{i}] and packs[{i}] must be lists, not both empty")
            total += len(names)
            if total > MAX_TENSORS:
                raise ValueError(f"more than {MAX_TENSORS} tensors in one update")
            _check_names(names, f"names[{i}]")
            for g, group in enumerate(packs):
                total += _check_group(group, f"packs[{i}][{g}]")
                if total > MAX_TENSORS:
                    raise ValueError(f"more than {MAX_TENSORS} tensors in one update")

    def ref_bytes(self, i: int) -> bytes:
        """The serialized ref ``refs[i]``; ValueError if it is not base64."""
        try:
            return base64.b64decode(self.refs[i], validate=True)
        except (binascii.Error, ValueError) as e:
            raise ValueError(f"refs[{i}] is not base64: {e}") from None


def _check_names(names: Any, what: str) -> None:
    if not isinstance(names, list):
        raise ValueError(f"{what} must be a list of names")
    for name in names:
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise ValueError(f"{what} holds {name!r}: want a non-empty string of at most {MAX_NAME} characters")


def _check_group(group: Any, what: str) -> int:
    """Checks one packed group; returns its member count."""
    if not isinstance(group, dict) or set(group) != {"dtype", "names", "shapes"}:
        raise ValueError(f"{what} must be a dict of dtype, names and shapes")
    if group["dtype"] not in DTYPES:
        raise ValueError(f"{what}: dtype {group['dtype']!r} is not one of {sorted(DTYPES)}")
    names, shapes = group["names"], group["shapes"]
    _check_names(names, f"{what}['names']")
    if not isinstance(shapes, list) or len(shapes) != len(names) or not names:
        raise ValueError(f"{what}: one shape per name, at least one name")
    if not all(type(shape) is list and len(shape) <= MAX_DIMS for shape in shapes):
        raise ValueError(f"{what}: each shape must be a list of at most {MAX_DIMS} sizes")
    return len(names)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """A step makes lists and tuples per tensor (names, shapes, layouts):
    with tens of thousands of tensors they would set off the garbage
    collector's full passes over the process, a pause longer than the
    step. Both sides pause it for a step."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def encode_ref(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass
class LibrdtTrainerInitInfo(TrainerInitInfo):
    """The trainer's settings. ``bucket_bytes`` bounds the bytes of one
    update call (whole layers go together, so one larger than the bound
    makes a bucket of its own); ``timeout_s`` is each step's deadline,
    passed on to the workers. ``listen_tcp``, ``advertise_host`` and
    ``auth_token`` are those of ``rdt.Runtime`` (workers on other hosts need
    a tcp listener; the token goes to the workers in the init info).
    ``transport`` forces one transport (None: rdt picks); ``views`` lets
    workers on this host map the buckets rather than copy them (see
    ``LibrdtInitInfo``)."""

    backend: ClassVar[str] = BACKEND
    bucket_bytes: int = 1 << 30
    timeout_s: float = 120.0
    listen_tcp: Optional[str] = None
    advertise_host: Optional[str] = None
    auth_token: Optional[str] = None
    transport: Optional[str] = None
    views: bool = False

    def __post_init__(self) -> None:
        # A trainer process that never starts vLLM runs none of vLLM's
        # plugins: the factory that takes this info must know "librdt" there.
        register()
        if isinstance(self.bucket_bytes, bool) or not isinstance(self.bucket_bytes, int) or self.bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be a positive int, not {self.bucket_bytes!r}")
        self.timeout_s = _positive_seconds(self.timeout_s, "timeout_s")
        for what in ("listen_tcp", "advertise_host", "auth_token", "transport"):
            _optional_str(getattr(self, what), what)
        if not isinstance(self.views, bool):
            raise ValueError(f"views must be a bool, not {self.views!r}")

    def worker_init_info(self) -> dict:
        return {"protocol": PROTOCOL, "timeout_s": self.timeout_s, "auth_token": self.auth_token,
                "transport": self.transport, "views": self.views}
