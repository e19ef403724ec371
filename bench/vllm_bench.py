"""Weight sync into vLLM's CPU build: rdt's "librdt" backend against the
ways a user syncs into a CPU vLLM today, in one run (make bench-vllm).

For each model size (a Llama of about 300 tensors at the largest, float32,
random weights, loaded by vLLM with load_format="dummy"), with the trainer's
Hugging Face model in this process and vLLM's worker in its own:

* librdt: WeightTransferTrainerFactory.trainer_init + send_weights(),
  the worker copying the bytes in (views=False, the default), then viewing
  the trainer's staged copy (views=True);
* rpc: the tensors pickled and sent through vLLM's collective_rpc, then
  handed to the worker's reload_weights (vLLM's in-place reload);
* shm checkpoint: a safetensors file written to /dev/shm, read in the
  worker and handed to reload_weights;
* memcpy: one copy of the same bytes in one process (torch, pre-faulted);
* rdt alone: the same bytes fetched by a plain process (no vLLM) with a
  prepared get rebound to each version, as librdt's worker fetches.

Each sync's time is split into moving the bytes and vLLM's load work
(librdt: the worker's time waiting for bytes and landing them, and its time
processing layers, which overlap; the others: everything before
reload_weights, and reload_weights), and each librdt sync's CPU seconds per process. Every
method is checked: vLLM's greedy
tokens equal the trainer model's after its sync.

Then the backend's cost per tensor: 37,000 tensors of 64 bytes synced from
a trainer process into a model whose every tensor lands in place.

    python bench/vllm_bench.py --out build/bench-vllm.json [--sizes 0.125,0.25,0.5] [--syncs 5]
"""

import argparse
import gc
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The rpc baseline pickles tensors and functions through collective_rpc.
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

import torch  # noqa: E402

# The trainer's side of a sync as the vLLM suite drives it (tests/vllm).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "vllm"))
from trainer_side import PipeClient, greedy, make_engine, serve_call, take_stdout  # noqa: E402

PROMPTS = [[1, 5, 9, 200], [7, 7, 300, 2, 11]]
TOKENS = 6
VLLM_OWN = {
    "nccl": "needs CUDA devices and NCCL (a torch.distributed NCCL group with the trainer)",
    "ipc": "moves CUDA IPC handles of GPU tensors: no GPU here",
    "sparse_nccl": "NCCL broadcasts of sparse patches: needs CUDA devices and NCCL",
    "nccl_m2n": "NCCL between trainer and inference ranks: needs CUDA devices and NCCL",
    "sharded_rdt": "needs vLLM's Ray executor, a Ray trainer actor with tensor_transport='nixl' and CUDA "
                   "events for its receive ring: it does not run on vLLM's CPU build",
    "modelexpress": "needs the ModelExpress client, installed from its git repository, and its server: "
                    "neither is on the package index",
}


def llama(size_gb, vocab=8192):
    """A Llama config of about size_gb of float32 weights, 9 tensors a layer."""
    from transformers import LlamaConfig

    hidden, inter = 512, 1536
    per_layer = 4 * (hidden * hidden * 2 + 2 * hidden * (hidden // 2) + 3 * hidden * inter + 2 * hidden)
    fixed = 4 * (2 * vocab * hidden + hidden)
    layers = max(1, round((size_gb * 1e9 - fixed) / per_layer))
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                       tie_word_embeddings=False)


def step(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


# ---- run in vLLM's worker (collective_rpc) ---------------------------------------------

def _reload_from(worker, blob):
    import pickle

    weights = pickle.loads(blob)
    t0 = time.perf_counter()
    worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    return time.perf_counter() - t0


def _reload_from_file(worker, path):
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    weights = load_file(path)
    t1 = time.perf_counter()
    worker.reload_weights(weights_iterator=list(weights.items()), is_checkpoint_format=True)
    return t1 - t0, time.perf_counter() - t1


def cpu_seconds():
    """CPU seconds (user and system) so far of this process and each of
    its descendants (vLLM's engine core and worker), by process name."""
    hz = os.sysconf("SC_CLK_TCK")
    procs = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            name = st[st.index("(") + 1:st.rindex(")")]
            fields = st[st.rindex(")") + 2:].split()
            procs[int(pid)] = (name, int(fields[1]), (int(fields[11]) + int(fields[12])) / hz)
    mine, out = {os.getpid()}, {}
    grew = True
    while grew:
        grew = False
        for pid, (_, ppid, _) in procs.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    for pid in mine:
        name, _, sec = procs[pid]
        name = "trainer (this process)" if pid == os.getpid() else name
        out[name] = out.get(name, 0.0) + sec
    return out


def _engine_seconds(worker):
    return worker.weight_transfer_engine.stats()["seconds"]


def bench_size(size_gb, syncs):
    from transformers import LlamaForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory
    from safetensors.torch import save_file

    from rdt.vllm import LibrdtTrainerInitInfo, LLMClient

    folder = tempfile.mkdtemp(prefix="vllm-bench-")
    torch.manual_seed(0)
    config = llama(size_gb)
    model = LlamaForCausalLM(config).eval()
    config.save_pretrained(folder)
    params = list(model.named_parameters())
    nbytes = sum(p.numel() * p.element_size() for _, p in params)
    llm = LLM(model=folder, load_format="dummy", skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              max_model_len=128, weight_transfer_config=WeightTransferConfig(backend="librdt"))
    sampling = SamplingParams(temperature=0, max_tokens=TOKENS, detokenize=False)

    def check(method):
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sampling, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        if got != greedy(model, PROMPTS, TOKENS):
            raise SystemExit(f"{method}: vLLM's tokens differ from the trainer's after the sync")

    row = {"gb": nbytes / 1e9, "tensors": len(params), "layers": config.num_hidden_layers}

    # memcpy of the same bytes, the destination faulted in once
    dst = [torch.empty_like(p) for _, p in params]
    for d, (_, p) in zip(dst, params):
        d.copy_(p)
    times = []
    for _ in range(syncs):
        t0 = time.perf_counter()
        for d, (_, p) in zip(dst, params):
            d.copy_(p)
        times.append(time.perf_counter() - t0)
    row["memcpy"] = {"sync": times}
    row["rdt_alone"] = {"sync": bench_rdt_alone(params, syncs)}
    del dst
    gc.collect()

    # librdt, copying then viewing: the first sync learns; the next ones are timed
    for key, views in (("librdt", False), ("librdt_views", True)):
        engine = WeightTransferTrainerFactory.trainer_init(LibrdtTrainerInitInfo(rank=0, timeout_s=600, views=views),
                                                           client=LLMClient(llm), source=ModuleSource(model))
        step(model, 0)
        engine.send_weights()
        check(f"{key} (learning)")
        syncs_t, moves, loads, transfers, cpu = [], [], [], [], {}
        for i in range(syncs + 1):  # the first replay makes the prepared gets: not timed
            step(model, i + 1)
            before = llm.collective_rpc(_engine_seconds)[0]
            cpu0 = cpu_seconds()
            t0 = time.perf_counter()
            engine.send_weights()
            elapsed = time.perf_counter() - t0
            cpu1 = cpu_seconds()
            after = llm.collective_rpc(_engine_seconds)[0]
            check(key)
            if i == 0:
                continue
            syncs_t.append(elapsed)
            moves.append(after["fetch"] + after["land"] - before["fetch"] - before["land"])
            loads.append(after["process"] + after["load"] - before["process"] - before["load"])
            transfers.append(after["transfer"] - before["transfer"])
            for name, sec in cpu1.items():
                cpu.setdefault(name, []).append(sec - cpu0.get(name, 0.0))
        engine.shutdown()
        row[key] = {"sync": syncs_t, "transfer": moves, "load": loads, "bytes_moving": transfers, "cpu": cpu}

    # tensors pickled through collective_rpc into reload_weights
    syncs_t, loads = [], []
    for i in range(syncs):
        step(model, 100 + i)
        t0 = time.perf_counter()
        blob = pickle.dumps([(n, p.detach()) for n, p in params], protocol=pickle.HIGHEST_PROTOCOL)
        load = llm.collective_rpc(_reload_from, args=(blob,))[0]
        del blob
        syncs_t.append(time.perf_counter() - t0)
        loads.append(load)
        check("rpc")
    row["rpc"] = {"sync": syncs_t, "transfer": [s - l for s, l in zip(syncs_t, loads)], "load": loads}

    # a safetensors checkpoint in /dev/shm, read in the worker
    path = os.path.join(tempfile.mkdtemp(prefix="vllm-bench-", dir="/dev/shm"), "model.safetensors")
    syncs_t, moves, loads = [], [], []
    for i in range(syncs):
        step(model, 200 + i)
        t0 = time.perf_counter()
        save_file({n: p.detach().contiguous() for n, p in params}, path)
        written = time.perf_counter() - t0
        read, load = llm.collective_rpc(_reload_from_file, args=(path,))[0]
        syncs_t.append(time.perf_counter() - t0)
        moves.append(written + read)
        loads.append(load)
        check("shm checkpoint")
        os.unlink(path)
    row["shm_checkpoint"] = {"sync": syncs_t, "transfer": moves, "load": loads}
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return row


# ---- rdt alone, between two plain processes ---------------------------------------------

def receiver_child():
    """Reads pickled refs (length-prefixed) on stdin, fetches each with one
    prepared get (rebound after the first) into buffers faulted in once,
    and answers each run's seconds on stdout."""
    import rdt

    inp, out = sys.stdin.buffer, sys.stdout
    prepared, bufs = None, None
    while True:
        head = inp.read(4)
        if len(head) < 4:
            return
        ref = pickle.loads(inp.read(int.from_bytes(head, "little")))
        if prepared is None:
            bufs = [torch.ones(s, dtype=getattr(torch, d)) for s, d in zip(ref.shapes, ref.dtypes)]
            prepared = rdt.prepare_get(ref, out=bufs)
        else:
            prepared.rebind([ref])
        t0 = time.perf_counter()
        prepared.run(timeout=600)
        seconds = time.perf_counter() - t0
        prepared.unbind()
        ref.close()
        out.write(json.dumps({"seconds": seconds}) + "\n")
        out.flush()


def bench_rdt_alone(params, syncs):
    """The same bytes fetched by a plain process (no vLLM) with a rebound
    prepared get, as librdt's worker does: the transfer alone."""
    import rdt

    child = subprocess.Popen([sys.executable, __file__, "--receiver-child"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=False)
    times = []
    try:
        for _ in range(syncs + 1):
            ref = rdt.put([p.detach() for _, p in params])
            blob = pickle.dumps(ref)
            child.stdin.write(len(blob).to_bytes(4, "little") + blob)
            child.stdin.flush()
            times.append(json.loads(child.stdout.readline())["seconds"])
            ref.close()
    finally:
        child.stdin.close()
        child.wait(60)
    return times[1:]  # the first faults the pages in


# ---- cost per tensor -------------------------------------------------------------------

class _Flat(torch.nn.Module):
    """count tensors of n float32 each, as one matrix whose rows they land in."""

    def __init__(self, count, n):
        super().__init__()
        self.rows = torch.nn.Parameter(torch.zeros(count, n), requires_grad=False)

    def load_weights(self, weights):
        for name, w in weights:
            self.rows.data[int(name[1:])].copy_(w)
        return set()


class _Many(torch.nn.Module):
    def __init__(self, count, n):
        super().__init__()
        for i in range(count):
            self.register_parameter(f"t{i}", torch.nn.Parameter(torch.full((n,), float(i)), requires_grad=False))


def trainer_child(count, n, syncs):
    out = take_stdout()  # the answers go over the pipe that was stdout
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

    import rdt.vllm

    rdt.vllm.register()
    engine = WeightTransferTrainerFactory.trainer_init(
        rdt.vllm.LibrdtTrainerInitInfo(rank=0, timeout_s=600), client=PipeClient(sys.stdin, out),
        source=ModuleSource(_Many(count, n)))
    times = []
    for _ in range(syncs + 2):
        t0 = time.perf_counter()
        engine.send_weights()
        times.append(time.perf_counter() - t0)
    source = []
    for _ in range(syncs):  # what iterating vLLM's ModuleSource costs, whatever the backend
        t0 = time.perf_counter()
        for _ in engine.source:
            pass
        source.append(time.perf_counter() - t0)
    out.write(json.dumps({"done": times, "source": source}) + "\n")
    out.flush()


def bench_tensors(count=37000, n=16, syncs=5):
    model = _Flat(count, n)
    engine = make_engine(model)
    child = subprocess.Popen([sys.executable, __file__, "--trainer-child", str(count), str(n), str(syncs)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    worker = []
    # This harness's JSON over pipes makes lists per tensor; its collector's
    # full passes over this process are not the backend's cost (vLLM's own
    # RPC decodes the update info in its place).
    gc.disable()
    while True:
        msg = json.loads(child.stdout.readline())
        if "done" in msg:
            break
        t0 = time.perf_counter()
        serve_call(engine, msg["call"], msg["arg"])
        if msg["call"] == "update_weights":
            worker.append(time.perf_counter() - t0)
        child.stdin.write(json.dumps({"ok": True}) + "\n")
        child.stdin.flush()
    child.wait(60)
    gc.enable()
    expected = torch.arange(count, dtype=torch.float32).unsqueeze(1).expand(count, n)
    if not torch.equal(model.rows.data, expected):
        raise SystemExit("the 37,000 tensors did not land")
    stats = engine.stats()
    engine.shutdown()
    # The first sync learns, the second makes the prepared gets; later ones
    # are what every step costs.
    return {"count": count, "bytes_each": 4 * n, "learn": msg["done"][0], "first_replay": msg["done"][1],
            "sync": msg["done"][2:], "worker_update": worker[2:], "source_iteration": msg["source"],
            "landing_tensors": stats["landing_tensors"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--sizes", default="0.125,0.25,0.5")
    p.add_argument("--syncs", type=int, default=5)
    p.add_argument("--trainer-child", nargs=3, type=int, help=argparse.SUPPRESS)
    p.add_argument("--receiver-child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.trainer_child:
        trainer_child(*a.trainer_child)
        return
    if a.receiver_child:
        receiver_child()
        return
    if not a.out:
        p.error("--out is required")
    results = {"sizes": [], "vllm_own": VLLM_OWN, "cpus": os.cpu_count()}
    for size in [float(s) for s in a.sizes.split(",")]:
        row = bench_size(size, a.syncs)
        results["sizes"].append(row)
        print(json.dumps({k: (statistics.median(v["sync"]) if isinstance(v, dict) else v) for k, v in row.items()}),
              flush=True)
    results["tensors"] = bench_tensors(syncs=a.syncs)
    print(json.dumps(results["tensors"]), flush=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
