"""A Ray cluster on a bed (bed.py): node i started with `ray start` on host
i, with the custom resource "h<i>" to place work by host, and a driver
(ray_driver.py) in the head's namespaces that a test drives."""

import os
import sys

from agent import Lines
from bed import Bed

HERE = os.path.dirname(os.path.abspath(__file__))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
MIB = 1 << 20


class RayCluster:
    """A Ray cluster on a bed: node i on host i, with the custom resource
    "h<i>" to place actors by host; env reaches every node and the driver."""

    def __init__(self, bed: Bed, env=None, object_store: int = 200 * MIB) -> None:
        self.bed = bed
        # Each host's HOME is its private /tmp: no ~/.ray of this machine's
        # user (an auth token file) joins the nodes.
        self.env = {"HOME": "/tmp", **(env or {})}
        head = bed.hosts[0]
        for i, h in enumerate(bed.hosts):
            where = ["--head", "--port", "6379", "--include-dashboard", "false"] if i == 0 else \
                ["--address", f"{head.address}:6379"]
            h.run([RAY, "start", *where, "--node-ip-address", h.address, "--num-cpus", "1",
                   "--object-store-memory", str(object_store), "--resources", f'{{"h{i}": 10}}',
                   "--disable-usage-stats"], env=self.env, timeout=180)
        self.driver = None

    def start_driver(self) -> Lines:
        """The command driver (ray_driver.py), started on the head's host."""
        self.driver = Lines(self.bed.hosts[0], [sys.executable, os.path.join(HERE, "ray_driver.py")], env=self.env)
        ready = self.driver.read(180)
        assert ready.get("ok"), ready
        return self.driver

    def call(self, op, **args):
        return self.driver.call(op, **args)

    def ask(self, op, **args):
        return self.driver.ask(op, **args)
