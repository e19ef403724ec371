"""A trainer in its own process for the engine contract tests. It reads
commands, one JSON line each, on stdin: {"init": {...LibrdtTrainerInitInfo
fields}}, {"sync": true}, {"perturb": seed}, {"save": path}. Its client
(PipeClient) writes each of vLLM's weight-sync calls as a JSON line to
stdout and reads the answer from stdin, so the test process plays vLLM's
worker. It ends each command with {"done": ...} or {"failed": "..."}."""

import json
import sys

from trainer_side import PipeClient, take_stdout

# The answers go over the pipe that is stdout now.
PIPE = take_stdout()

import torch  # noqa: E402
from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory  # noqa: E402

import rdt.vllm  # noqa: E402
from models import TrainerModel  # noqa: E402


def main():
    rdt.vllm.register()
    out = PIPE
    client = PipeClient(sys.stdin, out)
    model = TrainerModel(seed=int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    engine = None

    def reply(msg):
        out.write(json.dumps(msg) + "\n")
        out.flush()

    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if "init" in cmd:
                info = rdt.vllm.LibrdtTrainerInitInfo(rank=0, **cmd["init"])
                engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=ModuleSource(model))
                reply({"done": True})
            elif "sync" in cmd:
                reply({"done": engine.send_weights()})
            elif "perturb" in cmd:
                g = torch.Generator().manual_seed(cmd["perturb"])
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn(p.shape, generator=g))
                reply({"done": True})
            elif "save" in cmd:
                torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, cmd["save"])
                reply({"done": True})
        except Exception as e:
            reply({"failed": f"{type(e).__name__}: {e}", "cause": type(e.__cause__).__name__})


if __name__ == "__main__":
    main()
