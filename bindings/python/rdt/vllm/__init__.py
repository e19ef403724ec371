"""rdt as vLLM's weight-transfer backend "librdt".

    # the trainer                                   # vLLM, in any process
    from rdt.vllm import LibrdtTrainerInitInfo      LLM(model, weight_transfer_config=
    engine = WeightTransferTrainerFactory.             WeightTransferConfig(backend="librdt"))
        trainer_init(LibrdtTrainerInitInfo(rank=0),
                     client=client, source=ModuleSource(model))
    engine.send_weights()                           # every step

The trainer puts its parameters into rdt (no copy) and hands vLLM's workers
small JSON-safe refs through vLLM's own weight-sync calls (offline ``LLM``,
Ray actors or the HTTP routes); each worker pulls only the bytes its shard
reads, straight into the model's parameters where their layout allows and
through ``model.load_weights`` where vLLM transforms them. See
docs/vllm.md.

The rdt wheel registers the backend with vLLM through the
``vllm.general_plugins`` entry point: vLLM calls :func:`register` in each
of its processes. ``import rdt`` and ``import rdt.vllm`` import nothing of
vLLM; the names below load it on first use. Making a
``LibrdtTrainerInitInfo`` registers the backend in that process too (a
trainer that never starts vLLM runs no plugins).
"""

from __future__ import annotations

import importlib
from typing import Any

import rdt

BACKEND = "librdt"
"""The backend's name in vLLM's factories. Not "rdt": SkyRL already aliases
that name to vLLM's own "sharded_rdt" (Ray's RDT over NIXL)."""

# name -> module that defines it; imported when first asked for (PEP 562).
_LAZY = {
    "LibrdtInitInfo": "._wire",
    "LibrdtUpdateInfo": "._wire",
    "LibrdtTrainerInitInfo": "._wire",
    "WeightSyncError": "._wire",
    "LibrdtWeightTransferEngine": "._worker",
    "LibrdtTrainerWeightTransferEngine": "._trainer",
    "LLMClient": "._trainer",
}

_WORKER = ("rdt.vllm._worker", "LibrdtWeightTransferEngine")
_TRAINER = ("rdt.vllm._trainer", "LibrdtTrainerWeightTransferEngine")


def register() -> None:
    """Registers "librdt" with vLLM's worker and trainer factories. vLLM
    calls it (the entry point) in every process it starts, perhaps more
    than once: registering again does nothing. Raises
    rdt.AlreadyExistsError if another engine already holds the name."""
    from vllm.distributed.weight_transfer.factory import (WeightTransferEngineFactory,
                                                          WeightTransferTrainerFactory)

    for factory, (module, name) in ((WeightTransferEngineFactory, _WORKER),
                                    (WeightTransferTrainerFactory, _TRAINER)):
        try:
            factory.register_engine(BACKEND, module, name)
        except ValueError:  # the name is taken: by us (a second call) or by someone else
            ours = getattr(importlib.import_module(module), name)
            if factory._registry[BACKEND]() is not ours:
                raise rdt.AlreadyExistsError(f"vLLM already has a weight-transfer backend named {BACKEND!r} "
                                             f"that is not rdt's", rdt.AlreadyExistsError.status) from None


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rdt.vllm' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


__all__ = ["BACKEND", "register", *_LAZY]
