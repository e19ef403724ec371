"""A Ray driver on the head host of a bed cluster that a test drives, as
agent.py does: one JSON command per line on stdin, one JSON answer per line
on stdout. Actors are tests/python/ray_actors.Worker, placed by the custom
resource of their host ("h0", "h1", ...); refs are kept by name.

Commands: actor NAME HOST; make NAME ACTOR KIND [seed]; consume ACTOR REF
(answers "started", then whether the received value matched what was
made, or the error); moved ACTOR (bytes by rdt transport); stats ACTOR;
node ACTOR; address ACTOR; drop NAME; alive ACTOR.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))  # ray_actors
sys.path.insert(0, HERE)  # agent

import ray  # noqa: E402

import rdt.ray  # noqa: E402


from agent import failure, serve, speaker  # noqa: E402


class Driver:
    def __init__(self, say) -> None:
        self.say = say
        path = os.pathsep.join(p for p in (os.path.join(os.path.dirname(HERE), "python"),
                                           os.environ.get("PYTHONPATH", "")) if p)
        env = {"env_vars": {"PYTHONPATH": path}}
        ray.init(address="auto", runtime_env=rdt.ray.runtime_env(env), logging_level="WARNING")
        rdt.ray.register()
        global Worker, make_value, summary
        from ray_actors import Worker, make_value, summary  # noqa: F811 (after register, as Ray needs)
        self.actors = {}
        self.refs = {}
        self.made = {}

    def actor(self, name: str, host: str) -> dict:
        a = Worker.options(resources={host: 1}).remote()
        ray.get(a.ready.remote(), timeout=120)
        self.actors[name] = a
        return {}

    def make(self, name: str, actor: str, kind: str, seed: int = 0) -> dict:
        self.refs[name] = self.actors[actor].make.remote(kind, seed)
        self.made[name] = (kind, seed)
        return {}

    def consume(self, actor: str, ref: str, deadline: float = 120) -> dict:
        kind, seed = self.made[ref]
        call = self.actors[actor].consume.remote(self.refs[ref])
        self.say(event="started")
        t0 = time.monotonic()
        try:
            got = ray.get(call, timeout=deadline)
        except Exception as e:  # the test reads which error Ray raised
            return {"ok": False, "error": type(e).__name__, "message": str(e)[-2000:],
                    "seconds": time.monotonic() - t0}
        return {"same": got == summary(make_value(kind, seed)), "seconds": time.monotonic() - t0}

    def moved(self, actor: str) -> dict:
        return {"moved": ray.get(self.actors[actor].bytes_by_transport.remote(), timeout=60)}

    def stats(self, actor: str) -> dict:
        return {"stats": ray.get(self.actors[actor].stats.remote(), timeout=60)}

    def node(self, actor: str) -> dict:
        return {"node": ray.get(self.actors[actor].node.remote(), timeout=60)}

    def address(self, actor: str) -> dict:
        return {"address": ray.get(self.actors[actor].address.remote(), timeout=60),
                "token": rdt.ray._PROCESS.token()}

    def drop(self, name: str) -> dict:
        del self.refs[name]
        return {}

    def alive(self, actor: str, deadline: float = 30) -> dict:
        try:
            ray.get(self.actors[actor].ready.remote(), timeout=deadline)
        except Exception as e:
            return {"alive": False, "error": type(e).__name__}
        return {"alive": True}


def main() -> None:
    say = speaker()  # Ray prints its workers' logs to the driver's stdout
    try:
        driver = Driver(say)
    except Exception as e:
        say(**failure(e))
        return
    say(ok=True, event="ready")
    serve(driver, say)


if __name__ == "__main__":
    main()
