"""The examples in examples/python run and print what they promise."""

import os
import re
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,expect", [
    ("two_processes.py", "step 42 layer0 (1024, 1024) float32"),
    ("receive_into_buffers.py", "[0.0, 1.0, 2.0, 3.0]"),
    ("custom_transport.py", "over pyshm : [0 1 2 3 4 5 6 7 8 9]"),
    ("async_fetch.py", "gathered [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]"),
    ("reshard.py", "reshard: 2 receivers pulled their rows of 20 matrices from 2 trainers"),
    ("shared_view.py", "shared_view: 4 readers viewed the 64 MiB model"),
    ("push_ring.py", ("push_ring over shm: 6 versions applied, every byte checked",
                      "push_ring over tcp: 6 versions applied, every byte checked")),
])
def test_example(name, expect):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0, out.stderr
    for line in expect if isinstance(expect, tuple) else (expect,):
        assert line in out.stdout


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name,expect", [
    ("ray_actor_to_actor.py", "trainer holds 0 objects"),
    ("ray_put_and_target.py", "first elements [0.0, 4096.0, 8192.0"),
    ("weight_sync.py", "weight_sync: 4 versions reached every rank of 3 replicas"),
])
def test_ray_example(name, expect):
    pytest.importorskip("ray", reason="Ray is not installed (tests/python/requirements.txt pins it)")
    pytest.importorskip("torch", reason="the Ray examples move torch tensors; torch is not installed")
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True,
                         timeout=220)
    assert out.returncode == 0, out.stderr
    assert expect in out.stdout, out.stdout


@pytest.mark.timeout(120)
def test_nccl_example_runs_or_says_what_is_missing():
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "nccl_group.py")], capture_output=True,
                         text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    assert ("rank 1 received [0.0, 1.0, 2.0, 3.0]" in out.stdout or "needs torch" in out.stdout
            or "needs two GPUs" in out.stdout or "NCCL is not usable here" in out.stdout), out.stdout


@pytest.mark.timeout(120)
def test_observe_example():
    pytest.importorskip("prometheus_client", reason="prometheus_client is not installed (tests/python/requirements.txt pins it)")
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "observe.py")], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0, out.stderr
    # The warning reached logging (whose handler writes stderr), the
    # endpoint served the three fetches.
    assert "WARNING rdt rdt-" in out.stderr and "rdt[" not in out.stderr, out.stderr
    assert "the owner is gone: PeerUnavailableError" in out.stdout, out.stdout
    assert re.search(r'^rdt_fetch_seconds_count\{size_class="4KiB",transport="\w+"\} 2\.0$', out.stdout, re.M), out.stdout
    assert re.search(r'^rdt_fetch_seconds_count\{size_class="1MiB",transport="\w+"\} 1\.0$', out.stdout, re.M), out.stdout
