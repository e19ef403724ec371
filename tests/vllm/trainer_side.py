"""A trainer's weight sync into vLLM's worker, as this suite and
bench/vllm_bench.py both drive it: the trainer runs in a process of its own
whose client (PipeClient) writes each of vLLM's weight-sync calls as a JSON
line and reads the answer, and the process that plays vLLM's worker makes
each call on its engine (serve_call). Also what both check a sync by: the
greedy tokens of the trainer's Hugging Face model. Nothing here imports
vLLM or torch, so that a trainer process can take its stdout first."""

import json
import os


def take_stdout():
    """Keeps this process's stdout for the pipe and returns it; whatever
    else writes to stdout from here on (vLLM's log handler) goes to
    stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


class PipeClient:
    """A VLLMWeightSyncClient over a pipe: each call one JSON line to out,
    its answer one JSON line from inp."""

    def __init__(self, inp, out):
        self.inp, self.out = inp, out

    def _call(self, call, arg=None):
        self.out.write(json.dumps({"call": call, "arg": arg}) + "\n")
        self.out.flush()
        answer = json.loads(self.inp.readline())
        if "error" in answer:
            raise RuntimeError(answer["error"])

    def init_weight_transfer_engine(self, init_info):
        self._call("init_weight_transfer_engine", init_info)

    def start_weight_update(self):
        self._call("start_weight_update")

    def update_weights(self, update_info):
        self._call("update_weights", update_info)

    def finish_weight_update(self, weight_version=None):
        self._call("finish_weight_update", weight_version)


def serve_call(engine, call, arg, before_update=None):
    """Makes a call a PipeClient sent on the worker's engine;
    before_update, when given, sees an update's info first."""
    if call == "init_weight_transfer_engine":
        engine.init_transfer_engine(engine.parse_init_info(arg))
    elif call == "start_weight_update":
        engine.start_weight_update()
    elif call == "update_weights":
        if before_update is not None:
            before_update(arg)
        engine.update_weights(arg)
    elif call == "finish_weight_update":
        engine.finish_weight_update()


def make_engine(model):
    """The librdt backend's worker engine on the CPU, over model."""
    import torch
    from vllm.config import VllmConfig, WeightTransferConfig

    from rdt.vllm import LibrdtWeightTransferEngine

    return LibrdtWeightTransferEngine(WeightTransferConfig(backend="librdt"), VllmConfig(), torch.device("cpu"),
                                      model)


def greedy(model, prompts, tokens):
    """The tokens a Hugging Face model generates greedily after each of
    prompts (lists of token ids), tokens of them each."""
    import torch

    out = []
    for p in prompts:
        with torch.no_grad():
            g = model.generate(torch.tensor([p]), max_new_tokens=tokens, do_sample=False, pad_token_id=0)
        out.append(g[0, len(p):].tolist())
    return out
