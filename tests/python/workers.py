"""Code that runs in spawned child processes (importable by name)."""

import os
import pickle
import time

import numpy as np

import rdt
import transports_for_tests as tt


def dtype_arrays():
    out = {}
    for i, name in enumerate(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                              "uint64", "float16", "float32", "float64", "complex64", "complex128"]):
        a = (np.arange(24, dtype=np.int64).reshape(2, 3, 4) * (i + 3)) % 7
        out[name] = a.astype(name)
    out["zero_d"] = np.array(3.5)
    out["empty"] = np.zeros((0, 5), dtype=np.float32)
    return out


def serve(conn, transport=None, what="dtypes", register=None):
    """Puts objects, sends their pickled refs, and keeps them until told."""
    if register:
        for name, kind in register:
            rdt.register_tensor_transport(name, ["cpu"], getattr(tt, kind))
    if what == "dtypes":
        values = [{"name": k, "tensor": v} for k, v in dtype_arrays().items()]
    elif what == "nested":
        values = [{"a": [np.ones(3), (np.arange(4), "text", 7)], "b": {"c": np.full((2, 2), 9.0)}, "d": None}]
    elif what == "dlpack":
        values = [tt.DLPackOnly(np.arange(12, dtype=np.int32).reshape(3, 4))]
    elif what == "torch":
        import torch
        values = [{"f32": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                   "bf16": torch.arange(6, dtype=torch.bfloat16), "i64": torch.tensor(7),
                   "np": np.arange(3)}]
    elif what == "big":
        values = [np.arange(4 << 20, dtype=np.float64)]
    else:
        raise ValueError(what)
    refs = [rdt.put(v, transport=transport) for v in values]
    conn.send(pickle.dumps(refs))
    msg = conn.recv()
    if msg == "release":
        for r in refs:
            r.close()
        conn.send("released")
        conn.recv()
    conn.close()


def hold(conn, ref_bytes):
    """Unpickles a ref (a borrow) and keeps it until told, or until killed."""
    ref = pickle.loads(ref_bytes)
    conn.send("holding")
    if conn.recv() == "release":
        ref.close()
        conn.send("released")
    time.sleep(0.2)


def owner_then_exit(conn):
    """Puts an object, sends its ref, and exits without releasing."""
    ref = rdt.put(np.arange(10.0))
    conn.send(pickle.dumps(ref))
    conn.recv()
    os._exit(0)
