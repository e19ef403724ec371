"""vLLM weight sync over rdt: a trainer's Hugging Face model into vLLM.

vLLM's weight-transfer API picks its backend by name; the rdt wheel adds
"librdt" (an entry point vLLM loads in each of its processes). This script
writes a small Llama (random weights) into a folder, starts vLLM on it with
dummy weights and backend="librdt", then plays the trainer: each step it
changes the weights (a stand-in for an optimizer step), sends them with
send_weights(), and checks that vLLM's greedy tokens are now the trainer
model's own.

By default vLLM runs in this process (an offline LLM, driven through
LLMClient); with --http it is a `vllm serve` server with its weight-sync
routes, driven through vLLM's HTTPVLLMWeightSyncClient, and its tokens
come from /v1/completions. With --views, vLLM's worker maps the trainer's
one staged copy of each bucket rather than copying it (what several
replicas on the trainer's host share).

    python examples/python/vllm_sync.py [--steps 3] [--layers 2] [--http] [--views]

It needs vLLM (the CPU build runs here: tests/vllm/requirements.txt pins
it) and transformers; without them it says so and exits.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer import (HTTPVLLMWeightSyncClient, ModuleSource,
                                                  WeightTransferTrainerFactory)
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


def offline(folder):
    """vLLM in this process: the LLM, a client for its weight-sync calls and
    a function giving its greedy tokens."""
    llm = LLM(model=folder, load_format="dummy", skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              max_model_len=128, weight_transfer_config=WeightTransferConfig(backend="librdt"))
    sampling = SamplingParams(temperature=0, max_tokens=8, detokenize=False)

    def served():
        outs = llm.generate([{"prompt_token_ids": q} for q in PROMPTS], sampling, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return LLMClient(llm), served, lambda: None


def served_over_http(folder):
    """`vllm serve` with its weight-sync routes (VLLM_SERVER_DEV_MODE=1)
    on a free port: vLLM's HTTP client, the greedy tokens from
    /v1/completions, and a function that stops the server."""
    import requests

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # `vllm serve` itself; the CPU build's `vllm` command looks itself up as
    # the "vllm" distribution, which it is not, so run its module.
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--load-format", "dummy",
         "--skip-tokenizer-init", "--dtype", "float32",
         "--enforce-eager", "--max-model-len", "128", "--host", "127.0.0.1", "--port", str(port),
         "--weight-transfer-config", '{"backend": "librdt"}'],
        env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while True:
        if server.poll() is not None:
            raise SystemExit(f"vllm serve exited with {server.returncode} before it was up")
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            server.kill()
            raise SystemExit("vllm serve was not up within 600 s")
        time.sleep(1)

    def served():
        out = []
        for q in PROMPTS:
            r = requests.post(f"{url}/v1/completions", timeout=120,
                              json={"model": folder, "prompt": q, "max_tokens": 8, "temperature": 0,
                                    "return_token_ids": True})
            r.raise_for_status()
            out.append(r.json()["choices"][0]["token_ids"])
        return out

    def stop():
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()

    return HTTPVLLMWeightSyncClient(url), served, stop


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--http", action="store_true", help="vLLM as a `vllm serve` server, synced over its HTTP routes")
    p.add_argument("--views", action="store_true", help="the worker maps the trainer's staged copy instead of copying")
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    folder = tempfile.mkdtemp(prefix="vllm-sync-")
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=a.layers,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    trainer_model = LlamaForCausalLM(config).eval()
    trainer_model.save_pretrained(folder)

    # The inference side, told only the backend's name; a client for its
    # four weight-sync calls.
    client, served, stop = served_over_http(folder) if a.http else offline(folder)
    try:
        # The trainer side: its model as a WeightSource.
        engine = WeightTransferTrainerFactory.trainer_init(LibrdtTrainerInitInfo(rank=0, views=a.views), client=client,
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
    finally:
        stop()
    over = "vLLM's HTTP routes" if a.http else "an offline LLM"
    print(f"vllm_sync: {a.steps} versions reached vLLM ({over}) over rdt, every time the trainer's tokens")


if __name__ == "__main__":
    main()
