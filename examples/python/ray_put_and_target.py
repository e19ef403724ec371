"""rdt under Ray's put and get: an actor puts a tensor with the RDT
transport, the driver receives it into a buffer it already has, and an
async actor receives many objects concurrently.

    python examples/python/ray_put_and_target.py

Needs ray and torch (pip install ray torch).
"""

import asyncio

import ray
import torch

import rdt.ray

ray.init(runtime_env=rdt.ray.runtime_env(), include_dashboard=False, logging_level="ERROR")
rdt.ray.register()


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class KVCache:
    def __init__(self):
        self.blocks = torch.arange(16 * 4096, dtype=torch.float16).reshape(16, 4096)

    def share(self):
        # A list keeps Ray from resolving the ref on the way back.
        return [ray.put(self.blocks, _tensor_transport="RDT")]

    @ray.method(tensor_transport="RDT")
    def block(self, i):
        return self.blocks[i].clone()


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Decoder:
    async def decode(self, block, delay):
        await asyncio.sleep(delay)  # other requests run meanwhile
        return float(block[0])


cache = KVCache.remote()
[ref] = ray.get(cache.share.remote())

# Receive straight into a preallocated buffer.
buf = torch.empty(16, 4096, dtype=torch.float16)
ray.experimental.set_target_for_ref(ref, [buf])
got = ray.get(ref)
print("into my buffer:", got.data_ptr() == buf.data_ptr(), float(buf[1, 0]))

# An async actor takes 8 blocks at once; they finish out of order.
decoder = Decoder.remote()
firsts = ray.get([decoder.decode.remote(cache.block.remote(i), 0.01 * (8 - i)) for i in range(8)])
print("first elements", firsts)
ray.shutdown()
