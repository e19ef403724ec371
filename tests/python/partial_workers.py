"""The source side of test_partial.py, run in spawned processes: the values
it puts, which the test rebuilds to check what arrives."""

import pickle

import numpy as np

import rdt


def state():
    """A numpy state dict: matrices of several dtypes and row sizes, a
    vector, a scalar, an empty matrix and a value that is not a tensor.
    Every element differs from every other of its tensor."""
    return {
        "emb": np.arange(64 * 16, dtype=np.float32).reshape(64, 16),
        "w": (np.arange(33 * 7, dtype=np.float64) * 0.5 - 3).reshape(33, 7),
        "b": np.arange(10, dtype=np.int32) * -7,
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "cube": np.arange(6 * 4 * 3, dtype=np.uint16).reshape(6, 4, 3),
        "step": 7,
    }


def nested():
    """A state dict with nested layers."""
    return {"layers": [{"w": np.full((4, 3), float(i), np.float32)} for i in range(3)],
            "head": np.arange(12, dtype=np.int64).reshape(6, 2)}


def torch_state():
    import torch
    return {"w": torch.arange(40 * 8, dtype=torch.float32).reshape(40, 8),
            "h": torch.arange(20, dtype=torch.bfloat16)}


def serve(conn, with_torch):
    """Puts the values (each with the automatic transport choice), sends
    {name: pickled ref}, then waits until told to stop."""
    values = {"state": state(), "nested": nested(), "small": [np.arange(3, dtype=np.int8)]}
    if with_torch:
        values["torch"] = torch_state()
    refs = {k: rdt.put(v) for k, v in values.items()}
    conn.send({k: pickle.dumps(r) for k, r in refs.items()})
    try:
        conn.recv()
    except EOFError:
        pass
    for r in refs.values():
        r.close()
