"""rdt as Ray's tensor transport: a trainer hands its weights to two
generators and to the driver; rdt moves the tensors, Ray does the rest.

    python examples/python/ray_actor_to_actor.py

Needs ray and torch (pip install ray torch).
"""

import time

import ray
import torch

import rdt.ray

# Every worker registers rdt through the setup hook; the driver registers
# it too, before the actor classes below name it.
ray.init(runtime_env=rdt.ray.runtime_env(), include_dashboard=False, logging_level="ERROR")
rdt.ray.register()


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Trainer:
    def __init__(self):
        self.weights = {"w": torch.randn(1024, 1024), "b": torch.zeros(1024)}
        self.step = 0

    @ray.method(tensor_transport="RDT")
    def publish(self):
        self.step += 1
        # Tensors go over rdt; the rest (the step, the dict) through Ray.
        return {"step": self.step, **self.weights}

    def rdt_objects(self):
        return rdt.ray.runtime().stats()["objects"]


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Generator:
    def load(self, weights):
        return weights["step"], float(weights["w"].sum()), tuple(weights["w"].shape)

    def moved_by(self):
        return {t["name"]: t["bytes_received"] for t in rdt.ray.runtime().transports() if t["bytes_received"]}


trainer = Trainer.remote()
generators = [Generator.remote() for _ in range(2)]

ref = trainer.publish.remote()
print("generators loaded", ray.get([g.load.remote(ref) for g in generators]))
print("bytes by rdt transport", ray.get(generators[0].moved_by.remote()))
print("driver sees step", ray.get(ref)["step"])

# Ray counts the references; once the last goes, rdt frees the object.
del ref
for _ in range(100):
    if not ray.get(trainer.rdt_objects.remote()):
        break
    time.sleep(0.05)
print("trainer holds", ray.get(trainer.rdt_objects.remote()), "objects")
ray.shutdown()
