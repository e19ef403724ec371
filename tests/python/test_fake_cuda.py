"""cuda_ipc through the Python binding, on the test double of the CUDA
driver (tests/fakecuda): no GPU, torch or CuPy needed. `make python-test`
builds the double and names it in RDT_TEST_FAKECUDA; each test runs
fakecuda_workers in a fresh interpreter with RDT_CUDA_LIBRARY set to it.
What the double does and does not prove: docs/transports.md, "Testing GPU
code without a GPU".
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run(scenario, **env):
    lib = os.environ.get("RDT_TEST_FAKECUDA")
    if not lib or not os.path.exists(lib):
        pytest.skip("the CUDA driver double is not built (make python-test builds it and sets RDT_TEST_FAKECUDA)")
    e = dict(os.environ, RDT_CUDA_LIBRARY=lib, RDT_FAKECUDA_DEVICES="1", RDT_LOG="off", **env)
    e.pop("CUDA_VISIBLE_DEVICES", None)
    r = subprocess.run([sys.executable, "-c", f"import fakecuda_workers as w; w.{scenario}()"], cwd=HERE, env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and f"{scenario}: ok" in r.stdout, f"{r.stdout}\n{r.stderr}"


def test_cuda_array_interface_across_processes():
    run("across_processes")


def test_receives_across_host_and_cuda_memory():
    run("across_devices")


def test_cuda_array_interface_in_one_process():
    run("in_one_process")


def test_deadline_and_killed_source_while_copying():
    run("while_copying", RDT_FAKECUDA_COPY_DELAY_US="400000")


def test_waits_for_the_legacy_default_stream():
    run("legacy_stream")
