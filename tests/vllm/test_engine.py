"""The "librdt" engines' contract with vLLM, on the CPU: vLLM's worker
engine in this process against a model, the trainer in another process."""

import importlib.metadata
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import rdt
import rdt.vllm
from conftest import wait_until
from models import WorkerModel
from trainer_side import make_engine


def trainer_state(trainer, tmp_path):
    path = str(tmp_path / "trainer.pt")
    assert trainer.run({"save": path}) == {"done": True}
    return torch.load(path)


def check_synced(model, trainer, tmp_path):
    want = model.expected(trainer_state(trainer, tmp_path))
    for name, param in model.named_parameters():
        assert torch.equal(param.data, want[name]), name


def all_stopped(pid):
    tasks = f"/proc/{pid}/task"
    return all("State:\tT (stopped)" in open(f"{tasks}/{t}/status").read() for t in os.listdir(tasks))


def init(trainer, engine, **info):
    assert trainer.run({"init": {"timeout_s": 20.0, **info}}, engine) == {"done": True}


def session(trainer_factory, seed, model=None, **info):
    """A worker engine over model (a whole WorkerModel by default) and a
    trainer of seed, its engine initialized (info) against the worker's."""
    if model is None:
        model = WorkerModel()
    engine = make_engine(model)
    trainer = trainer_factory(seed=seed)
    init(trainer, engine, **info)
    return model, engine, trainer


@pytest.mark.parametrize("views", [False, True], ids=["copies", "views"])
def test_sync_lands_every_parameter_in_place_and_again_after_a_change(trainer_factory, tmp_path, views):
    model = WorkerModel()
    engine = make_engine(model)
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    trainer = trainer_factory(seed=1)
    init(trainer, engine, views=views)
    model_bytes = model.shard_bytes()  # one rank: the whole model
    for round_ in range(3):
        before = engine.stats()
        assert trainer.run({"sync": True}, engine) == {"done": round_ + 1}
        check_synced(model, trainer, tmp_path)
        assert {n: p.data_ptr() for n, p in model.named_parameters()} == ptrs
        after = engine.stats()
        assert after["views_open"] == 0  # a view lives no longer than its update call
        if round_ == 0:  # learning: whole tensors, fetched
            assert after["bytes_received"] - before["bytes_received"] == model_bytes
        elif views:  # the trainer's one staged copy read where it lies: nothing fetched
            assert after["bytes_received"] == before["bytes_received"]
            assert after["bytes_mapped"] - before["bytes_mapped"] == model_bytes
        else:
            assert after["bytes_received"] - before["bytes_received"] == model_bytes
            assert after["bytes_mapped"] == 0
        assert trainer.run({"perturb": round_}) == {"done": True}
    stats = engine.stats()
    assert stats["version"] == 3 and stats["syncs"] == 3 and stats["reload"] is False
    # q, k, v, embed and norm land in place; out is transposed by its loader.
    assert stats["landing_tensors"] == 5 and stats["loaded_tensors"] == 1 and stats["staged_layers"] == 0
    assert trainer.calls == ["init_weight_transfer_engine"] + ["start_weight_update", "update_weights",
                                                               "finish_weight_update"] * 3
    assert not trainer.errors
    engine.shutdown()


def test_a_tensor_parallel_rank_pulls_only_its_rows(trainer_factory, tmp_path):
    model, engine, trainer = session(trainer_factory, 2, WorkerModel(rank=1, world=2))
    assert trainer.run({"sync": True}, engine) == {"done": 1}  # learns what the loaders read: all of it moves
    check_synced(model, trainer, tmp_path)
    assert trainer.run({"perturb": 5}) == {"done": True}
    before = engine.stats()["bytes_received"]
    assert trainer.run({"sync": True}, engine) == {"done": 2}
    check_synced(model, trainer, tmp_path)
    assert engine.stats()["bytes_received"] - before == model.shard_bytes()
    engine.shutdown()


@pytest.mark.parametrize("views", [False, True], ids=["copies", "views"])
def test_a_trainer_killed_mid_sync_fails_it_in_time_and_the_next_session_syncs(trainer_factory, tmp_path, views):
    model, engine, trainer = session(trainer_factory, 3, views=views)
    assert trainer.run({"sync": True}, engine) == {"done": 1}
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert trainer.run({"perturb": 1}) == {"done": True}

    def kill_first(update_info):
        trainer.kill()  # the refs are in hand; their owner is gone before the pull

    trainer.send({"sync": True})
    start = trainer.read()
    trainer.answer(engine, start)
    update = trainer.read()
    t0 = time.monotonic()
    with pytest.raises(EOFError):
        trainer.answer(engine, update, before_update=kill_first)
        trainer.read()
    elapsed = time.monotonic() - t0
    assert len(trainer.errors) == 1 and isinstance(trainer.errors[0], rdt.RdtError), trainer.errors
    assert elapsed < 20.0
    for n, p in model.named_parameters():  # nothing of the failed sync landed
        assert torch.equal(p.data, old[n]), n
    assert engine.stats()["fetches_active"] == 0

    trainer2 = trainer_factory(seed=4)
    init(trainer2, engine, views=views)
    assert trainer2.run({"sync": True}, engine) == {"done": 1}
    check_synced(model, trainer2, tmp_path)
    engine.shutdown()


@pytest.mark.parametrize("views", [False, True], ids=["copies", "views"])
def test_a_stopped_trainer_fails_the_sync_at_its_deadline(trainer_factory, tmp_path, views):
    model, engine, trainer = session(trainer_factory, 5, timeout_s=2.0, views=views)
    synced = 0
    if views:  # a replay views; the first sync of a layout fetches (learning)
        assert trainer.run({"sync": True}, engine) == {"done": 1}
        synced = 1
    trainer.send({"sync": True})
    trainer.answer(engine, trainer.read())  # start
    update = trainer.read()
    os.kill(trainer.proc.pid, signal.SIGSTOP)
    assert wait_until(lambda: all_stopped(trainer.proc.pid))  # every thread, before the worker asks
    t0 = time.monotonic()
    try:
        trainer.answer(engine, update)
    finally:
        os.kill(trainer.proc.pid, signal.SIGCONT)
    elapsed = time.monotonic() - t0
    assert len(trainer.errors) == 1 and isinstance(trainer.errors[0], rdt.GetTimeoutError), trainer.errors
    assert elapsed < 2.0 + 5.0
    msg = trainer.read()  # the trainer sees the refusal and gives the step up
    while "call" in msg:
        trainer.answer(engine, msg)
        msg = trainer.read()
    assert "failed" in msg and "WeightSyncError" in msg["failed"], msg
    assert engine.stats()["version"] == (synced if synced else -1)  # the last update received whole
    assert engine.stats()["views_open"] == 0
    assert trainer.run({"sync": True}, engine) == {"done": synced + 1}  # the next step syncs
    check_synced(model, trainer, tmp_path)
    engine.shutdown()


@pytest.mark.parametrize("update, why", [
    ({"version": 1, "refs": ["not base64!"], "names": [["q"]]}, "not base64"),
    ({"version": 1, "refs": ["AAAA"], "names": [["q"], ["k"]]}, "one list per ref"),
    ({"version": -1, "refs": ["AAAA"], "names": [["q"]]}, "non-negative"),
    ({"version": 1, "refs": [], "names": []}, "at least one ref"),
    ({"version": 1, "refs": ["AAAA"], "names": [["x" * 5000]]}, "at most 4096"),
    ({"version": 1, "refs": ["AAAA"], "names": [["q"] * ((1 << 20) + 1)]}, "more than"),
    ({"version": 1, "refs": ["AAAA"], "names": [["q"]], "extra": 1}, "Invalid update_info"),
    ({"version": 1, "refs": ["AAAA"], "names": [["q"]], "abandon": True}, "carries no refs"),
    ({"version": 1, "refs": ["AAAA"], "names": [["q"]], "packs": [[], []]}, "one list of groups per ref"),
    ({"version": 1, "refs": ["AAAA"], "names": [[]], "packs": [[]]}, "not both empty"),
    ({"version": 1, "refs": ["AAAA"], "names": [[]], "packs": [[{"dtype": "complex128", "names": ["a"],
                                                                   "shapes": [[1]]}]]}, "is not one of"),
    ({"version": 1, "refs": ["AAAA"], "names": [[]], "packs": [[{"dtype": "float32", "names": ["a", "b"],
                                                                   "shapes": [[1]]}]]}, "one shape per name"),
    ({"version": 1, "refs": ["AAAA"], "names": [[]], "packs": [[{"dtype": "float32", "names": ["a"],
                                                                   "shapes": [[1] * 9]}]]}, "at most 8 sizes"),
    ({"version": 1, "refs": ["AAAA"], "names": [[]], "packs": [[{"dtype": "float32", "names": ["a"],
                                                                   "shapes": [[1]], "x": 0}]]}, "a dict of"),
])
def test_bad_update_infos_are_refused_before_anything_is_fetched(update, why):
    engine = make_engine(WorkerModel())
    engine.init_transfer_engine(engine.parse_init_info({}))
    engine.start_weight_update()
    with pytest.raises(ValueError, match=why):
        engine.update_weights(update)
    assert engine.stats()["bytes_received"] == 0
    engine.shutdown()


@pytest.mark.parametrize("shapes, why", [([[3], [3]], "describes 6 elements"), ([[12], [-2]], "non-negative"),
                                         ([[5], [5.0]], "non-negative ints")])
def test_packs_that_do_not_match_their_tensor_are_refused_before_anything_is_allocated(shapes, why):
    from rdt.vllm._wire import encode_ref

    engine = make_engine(WorkerModel())
    engine.init_transfer_engine(engine.parse_init_info({"timeout_s": 10}))
    engine.start_weight_update()
    with rdt.Runtime(name="packer") as trainer:
        ref = trainer.put([torch.zeros(10)])
        with pytest.raises(ValueError, match=why):
            engine.update_weights({"version": 1, "refs": [encode_ref(ref.serialize())], "names": [[]],
                                   "packs": [[{"dtype": "float32", "names": ["q", "k"], "shapes": shapes}]]})
        ref.close()
    assert engine.stats()["bytes_received"] == 0
    engine.shutdown()


def test_a_ref_that_is_not_one_is_refused_with_a_typed_error():
    engine = make_engine(WorkerModel())
    engine.init_transfer_engine(engine.parse_init_info({"timeout_s": 5}))
    engine.start_weight_update()
    with pytest.raises(rdt.RdtError):
        engine.update_weights({"version": 1, "refs": ["AAAAAAAAAAAA"], "names": [["q"]]})
    engine.shutdown()


def test_init_infos_from_another_protocol_or_with_bad_values_are_refused():
    engine = make_engine(WorkerModel())
    for bad, why in (({"protocol": 2}, "protocol"), ({"timeout_s": 0}, "positive"),
                     ({"timeout_s": float("nan")}, "positive"), ({"auth_token": 5}, "string"),
                     ({"views": "yes"}, "bool")):
        with pytest.raises(ValueError, match=why):
            engine.parse_init_info(bad)
    with pytest.raises(RuntimeError, match="init_weight_transfer_engine first"):
        engine.start_weight_update()


def test_registration_is_idempotent_and_the_entry_point_names_it():
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    rdt.vllm.register()
    rdt.vllm.register()
    assert WeightTransferEngineFactory._registry["librdt"]() is rdt.vllm.LibrdtWeightTransferEngine
    assert WeightTransferTrainerFactory._registry["librdt"]() is rdt.vllm.LibrdtTrainerWeightTransferEngine
    eps = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "librdt"]
    assert [e.value for e in eps] == ["rdt.vllm:register"]


def test_importing_rdt_vllm_imports_nothing_of_vllm():
    code = "import sys, rdt, rdt.vllm; print(any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_trainer_process_that_never_starts_vllm_finds_the_backend():
    code = ("from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory as F\n"
            "assert 'librdt' not in F._registry\n"
            "from rdt.vllm import LibrdtTrainerInitInfo\n"
            "LibrdtTrainerInitInfo(rank=0)\n"
            "print(F._registry['librdt']().__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "LibrdtTrainerWeightTransferEngine"
