"""Small models for the engine contract tests: the trainer's (names and
layout as a checkpoint has them) and the worker's (as vLLM builds one: its
own parameters, a fused qkv, a tensor-parallel rank's rows, and a
load_weights that maps the checkpoint onto them)."""

import torch

HIDDEN, HEADS_ROWS, OUT, VOCAB = 32, 16, 48, 64


class TrainerModel(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        for name, shape in (("embed", (VOCAB, HIDDEN)), ("q", (HEADS_ROWS, HIDDEN)), ("k", (HEADS_ROWS, HIDDEN)),
                            ("v", (HEADS_ROWS, HIDDEN)), ("out", (OUT, HIDDEN)), ("norm", (HIDDEN,))):
            self.register_parameter(name, torch.nn.Parameter(torch.randn(shape, generator=g), requires_grad=False))


class WorkerModel(torch.nn.Module):
    """Rank ``rank`` of ``world`` tensor-parallel ranks. q, k and v land in
    one fused parameter (rows of this rank only), embed's rows are split
    like a vocabulary-parallel embedding, out is kept transposed (a layout
    vLLM must transform, so it goes through load_weights), norm whole."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        super().__init__()
        self.rank, self.world = rank, world
        rows = HEADS_ROWS // world
        self.qkv = torch.nn.Parameter(torch.zeros(3 * rows, HIDDEN), requires_grad=False)
        self.embed = torch.nn.Parameter(torch.zeros(VOCAB // world, HIDDEN), requires_grad=False)
        self.out_t = torch.nn.Parameter(torch.zeros(HIDDEN, OUT), requires_grad=False)
        self.norm = torch.nn.Parameter(torch.zeros(HIDDEN), requires_grad=False)

    def load_weights(self, weights):
        loaded = set()
        for name, w in weights:
            if name in ("q", "k", "v"):
                rows = HEADS_ROWS // self.world
                shard = "qkv".index(name)
                self.qkv.data.narrow(0, shard * rows, rows).copy_(w.narrow(0, self.rank * rows, rows))
            elif name == "embed":
                rows = VOCAB // self.world
                self.embed.data.copy_(w.narrow(0, self.rank * rows, rows))
            elif name == "out":
                self.out_t.data.copy_(w.t())
            elif name == "norm":
                self.norm.data.copy_(w)
            else:
                raise KeyError(name)
            loaded.add(name)
        return loaded

    def expected(self, trainer: dict) -> dict:
        """What each parameter must hold after a sync from ``trainer``'s
        state dict."""
        rows = HEADS_ROWS // self.world
        qkv = torch.cat([trainer[n][self.rank * rows:(self.rank + 1) * rows] for n in "qkv"])
        er = VOCAB // self.world
        return {"qkv": qkv, "embed": trainer["embed"][self.rank * er:(self.rank + 1) * er],
                "out_t": trainer["out"].t().contiguous(), "norm": trainer["norm"]}

    def shard_bytes(self) -> int:
        """The bytes a sync must move to this rank: its rows of q, k, v and
        embed, out whole (the loader reads all of it), norm."""
        f = 4
        return f * (3 * (HEADS_ROWS // self.world) * HIDDEN + (VOCAB // self.world) * HIDDEN + OUT * HIDDEN + HIDDEN)
