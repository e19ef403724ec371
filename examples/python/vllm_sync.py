"""vLLM weight sync over rdt: a trainer's Hugging Face model into vLLM.

vLLM's weight-transfer API picks its backend by name; the rdt wheel adds
"librdt" (an entry point vLLM loads in each of its processes). This script
writes a small Llama (random weights) into a folder, starts vLLM on it with
dummy weights and backend="librdt", then plays the trainer: each step it
changes the weights (a stand-in for an optimizer step), sends them with
send_weights(), and checks that vLLM's greedy tokens are now the trainer
model's own.

    python examples/python/vllm_sync.py [--steps 3] [--layers 2]

It needs vLLM (the CPU build runs here: tests/vllm/requirements.txt pins
it) and transformers; without them it says so and exits.
"""

import argparse
import os
import tempfile
import time

try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory
except ImportError as e:
    raise SystemExit(f"vllm_sync.py needs vLLM and transformers ({e}): see docs/vllm.md") from None

from rdt.vllm import LibrdtTrainerInitInfo, LLMClient

PROMPTS = [[1, 5, 9, 200], [7, 7, 300, 2, 11]]


def greedy(model, n):
    out = []
    for p in PROMPTS:
        with torch.no_grad():
            g = model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, pad_token_id=0)
        out.append(g[0, len(p):].tolist())
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    folder = tempfile.mkdtemp(prefix="vllm-sync-")
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=a.layers,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    trainer_model = LlamaForCausalLM(config).eval()
    trainer_model.save_pretrained(folder)

    # The inference side: any vLLM, told the backend's name.
    llm = LLM(model=folder, load_format="dummy", skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              max_model_len=128, weight_transfer_config=WeightTransferConfig(backend="librdt"))
    sampling = SamplingParams(temperature=0, max_tokens=8, detokenize=False)

    def served():
        outs = llm.generate([{"prompt_token_ids": q} for q in PROMPTS], sampling, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    # The trainer side: its model as a WeightSource, vLLM through a client
    # (LLMClient here; vLLM's RayVLLMWeightSyncClient or
    # HTTPVLLMWeightSyncClient for a remote one).
    engine = WeightTransferTrainerFactory.trainer_init(LibrdtTrainerInitInfo(rank=0), client=LLMClient(llm),
                                                       source=ModuleSource(trainer_model))
    for step in range(a.steps):
        with torch.no_grad():  # the "optimizer step"
            for w in trainer_model.parameters():
                w.add_(torch.randn_like(w) * 0.5)
        t0 = time.monotonic()
        version = engine.send_weights()
        seconds = time.monotonic() - t0
        same = served() == greedy(trainer_model, 8)
        print(f"step {step}: version {version} synced in {seconds * 1000:.0f} ms; "
              f"vLLM's tokens {'match' if same else 'DIFFER FROM'} the trainer's")
        if not same:
            raise SystemExit(1)
    engine.shutdown()
    print(f"vllm_sync: {a.steps} versions reached vLLM over rdt, every time the trainer's tokens")


if __name__ == "__main__":
    main()
