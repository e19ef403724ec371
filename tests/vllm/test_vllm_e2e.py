"""rdt as the weight-transfer backend of a real vLLM (the CPU build): a
small Llama written here (random weights, no tokenizer, float32), loaded by
``LLM(load_format="dummy")`` with ``backend="librdt"`` found through the
entry point in vLLM's own worker process, synced from a Hugging Face model
of the same config in this process."""

import hashlib
import os

import pytest
import torch

from trainer_side import greedy

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# Only for reading the worker's engine from the test (collective_rpc of a function).
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

PROMPTS = [[1, 5, 9, 200], [7, 7, 300, 2, 11], [42, 3]]
TOKENS = 8


def _engine_stats(worker):
    return worker.weight_transfer_engine.stats()


def _engine_digests(worker):
    return worker.weight_transfer_engine.digests()


def _record_digests(worker):
    worker.weight_transfer_engine.record_digests()


def _stop_digests(worker):
    worker.weight_transfer_engine.record_digests(False)


def hf_greedy(model):
    return greedy(model, PROMPTS, TOKENS)


def digests(model):
    return {n: hashlib.sha256(p.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
            for n, p in model.named_parameters()}


def llama_and_vllm(path, seed, **llm_args):
    """A small Llama of random weights (seed) saved at path, as the
    trainer's Hugging Face model, and vLLM's CPU build serving its config
    with dummy weights and the librdt backend; a function of vLLM's greedy
    tokens for PROMPTS."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.config import WeightTransferConfig

    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(path)
    llm = LLM(model=path, load_format="dummy", skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              max_model_len=128, weight_transfer_config=WeightTransferConfig(backend="librdt"), **llm_args)
    params = SamplingParams(temperature=0, max_tokens=TOKENS, detokenize=False)

    def generate():
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return hf, llm, generate


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    hf, llm, generate = llama_and_vllm(str(tmp_path_factory.mktemp("llama")), seed=0)
    yield hf, llm, generate
    llm.llm_engine.engine_core.shutdown()


def test_vllm_serves_the_trainers_weights_after_each_sync(setup):
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

    from rdt.vllm import LibrdtTrainerInitInfo, LLMClient

    hf, llm, generate = setup
    want = hf_greedy(hf)
    assert generate() != want  # dummy weights: another model
    trainer = WeightTransferTrainerFactory.trainer_init(LibrdtTrainerInitInfo(rank=0, timeout_s=60),
                                                        client=LLMClient(llm), source=ModuleSource(hf))
    model_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())
    try:
        for round_ in range(2):
            before = llm.collective_rpc(_engine_stats)[0] if round_ else {"bytes_received": 0}
            assert trainer.send_weights() == round_ + 1
            assert generate() == want
            assert llm.get_weight_version() == str(round_ + 1)
            stats = llm.collective_rpc(_engine_stats)[0]
            assert stats["version"] == round_ + 1 and stats["syncs"] == round_ + 1
            assert stats["reload"] is True  # the CPU build repacks linear weights after loading them
            # Every tensor lands as bytes: norms in place, linear layers and
            # embeddings in staged weights that vLLM's processing repacks.
            n_layers = hf.config.num_hidden_layers
            assert stats["landing_tensors"] == len(list(hf.parameters())) and stats["loaded_tensors"] == 0, stats
            assert stats["staged_layers"] == 4 * n_layers + 2, stats  # qkv, o, gate_up, down; embed, lm_head
            assert stats["bytes_received"] - before["bytes_received"] == model_bytes
            assert set(stats["transports"]) <= {"cma", "shm"} and sum(stats["transports"].values()) == \
                stats["bytes_received"]
            assert llm.collective_rpc(_engine_digests)[0] == digests(hf)
            # The next round's weights: other tokens, then the same again after the sync.
            g = torch.Generator().manual_seed(round_)
            with torch.no_grad():
                for p in hf.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 0.5)
            changed = hf_greedy(hf)
            assert changed != want
            want = changed
    finally:
        trainer.shutdown()


class ReversedSource:
    """A trainer's weights in the reverse of the model's order: a layer's
    q, k and v (gate and up) come as v, k, q (up, gate), so vLLM's fused
    weights do not lie in order in the trainer's objects."""

    def __new__(cls, model):
        from vllm.distributed.weight_transfer import ModuleSource

        class Reversed(ModuleSource):
            def metadata(self):
                return list(reversed(super().metadata()))

            def __iter__(self):
                return reversed(list(super().__iter__()))

        return Reversed(model)


@pytest.mark.parametrize("order", ["model", "reversed"])
def test_views_process_layers_from_the_trainers_one_staged_copy(setup, order):
    """views=True: after the sync that learns the layout, the worker fetches
    nothing; it maps the trainer's staged objects and vLLM's processing
    reads every weight that lies there whole and in order (all of them in
    the model's order; with q, k, v and gate, up reversed, only o, down
    and the embeddings, the rest copied into the staged weights first)."""
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

    from rdt.vllm import LibrdtTrainerInitInfo, LLMClient

    hf, llm, generate = setup
    source = ModuleSource(hf) if order == "model" else ReversedSource(hf)
    trainer = WeightTransferTrainerFactory.trainer_init(LibrdtTrainerInitInfo(rank=0, timeout_s=60, views=True),
                                                        client=LLMClient(llm), source=source)
    model_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())
    n_layers = hf.config.num_hidden_layers
    in_order = 4 * n_layers + 2 if order == "model" else 2 * n_layers + 2
    llm.collective_rpc(_record_digests)
    try:
        for round_ in range(3):
            g = torch.Generator().manual_seed(100 + round_)
            with torch.no_grad():
                for p in hf.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 0.5)
            want = hf_greedy(hf)
            before = llm.collective_rpc(_engine_stats)[0]
            assert trainer.send_weights() == round_ + 1
            assert generate() == want
            after = llm.collective_rpc(_engine_stats)[0]
            assert llm.collective_rpc(_engine_digests)[0] == digests(hf)
            assert after["views_open"] == 0
            learned = after["plans"] > before["plans"]  # a layout's first sync fetches whole tensors
            assert learned == (round_ == 0 and (order == "reversed" or before["plans"] == 0)), (round_, before, after)
            if not learned:
                assert after["bytes_received"] == before["bytes_received"], "a replay with views fetches nothing"
                assert after["bytes_mapped"] - before["bytes_mapped"] == model_bytes
                assert after["mapped_weights"] - before["mapped_weights"] == in_order
    finally:
        trainer.shutdown()
        llm.collective_rpc(_stop_digests)


def test_tensor_parallel_ranks_each_pull_only_their_shard(tmp_path, monkeypatch):
    """Two tensor-parallel ranks of a real vLLM: after the sync that learns
    the layout, each rank's replay moves exactly its shard: half of every
    weight matrix (rows of q, k, v, gate, up and the embeddings; columns of
    o and down, one span a row) and the norms whole."""
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

    from rdt.vllm import LibrdtTrainerInitInfo, LLMClient

    # Two ranks on two cores: vLLM's automatic binding would keep one core for its engine core.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    hf, llm, generate = llama_and_vllm(str(tmp_path / "llama"), seed=1, tensor_parallel_size=2,
                                       distributed_executor_backend="mp")
    shard = sum(p.numel() * p.element_size() // (2 if p.dim() == 2 else 1) for p in hf.parameters())
    trainer = WeightTransferTrainerFactory.trainer_init(LibrdtTrainerInitInfo(rank=0, timeout_s=60),
                                                        client=LLMClient(llm), source=ModuleSource(hf))
    try:
        for round_ in range(3):
            before = llm.collective_rpc(_engine_stats)
            assert trainer.send_weights() == round_ + 1
            assert generate() == hf_greedy(hf)
            after = llm.collective_rpc(_engine_stats)
            assert len(after) == 2 and [a["version"] for a in after] == [round_ + 1] * 2
            if round_:  # a replay: each rank its shard
                assert [a["bytes_received"] - b["bytes_received"] for a, b in zip(after, before)] == [shard] * 2
            g = torch.Generator().manual_seed(200 + round_)
            with torch.no_grad():
                for p in hf.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 0.5)
    finally:
        trainer.shutdown()
        llm.llm_engine.engine_core.shutdown()


def test_the_example_syncs_a_vllm_server_over_its_http_routes():
    """examples/python/vllm_sync.py --http: `vllm serve` with
    --weight-transfer-config, vLLM's HTTPVLLMWeightSyncClient, the tokens
    from /v1/completions (the offline path is the test above)."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(here, "..", "..", "examples", "python", "vllm_sync.py")
    out = subprocess.run([sys.executable, example, "--steps", "2", "--layers", "1", "--http"], capture_output=True,
                         text=True, timeout=540)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    assert "vllm_sync: 2 versions reached vLLM (vLLM's HTTP routes) over rdt, every time the trainer's tokens" \
        in out.stdout
