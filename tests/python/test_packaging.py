"""The wheel and the process lifecycle."""

import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(300)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _wheel(tmp_path):
    whl = os.environ.get("RDT_WHEEL")
    if whl:
        return whl
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path),
                    os.path.join(ROOT, "bindings", "python")], check=True)
    return glob.glob(str(tmp_path / "rdt-*.whl"))[0]


def test_wheel_is_platform_tagged_and_works_without_go(tmp_path):
    whl = _wheel(tmp_path)
    assert os.path.basename(whl).endswith("-py3-none-linux_x86_64.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # numpy comes from pip's cache or index; the wheel itself needs nothing built.
    import numpy
    env = {k: v for k, v in os.environ.items() if k not in ("RDT_LIBRARY", "PYTHONPATH")}
    subprocess.run([py, "-m", "pip", "install", "-q", whl, f"numpy=={numpy.__version__}"], check=True, env=env)
    env["PATH"] = str(venv / "bin") + ":/usr/bin:/bin"
    assert shutil.which("go", path=env["PATH"]) is None, "go must not be on PATH for this check"
    smoke = textwrap.dedent("""
        import numpy as np, rdt
        with rdt.Runtime("a") as a, rdt.Runtime("b") as b:
            ref = a.put({"x": np.arange(5.0)})
            got = b.get(b.deserialize(ref.serialize(), ref._skeleton, ref._frameworks))
            assert (got["x"] == np.arange(5.0)).all()
        print("smoke ok", rdt.__version__)
    """)
    out = subprocess.run([py, "-c", smoke], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "smoke ok" in out.stdout


def test_interpreter_exit_with_live_runtimes_and_transports():
    code = textwrap.dedent("""
        import sys, numpy as np, rdt
        sys.path.insert(0, %r)
        import transports_for_tests as tt
        rt = rdt.Runtime("left-open")
        rt.register_tensor_transport("pyshm", ["cpu"], tt.PyShm)
        keep = [rt.put(np.ones(1000), transport="pyshm"), rt.put(np.ones(10))]
        rdt.put(np.zeros(3))  # the default runtime too
        print("exiting")
    """ % os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
    assert "Traceback" not in out.stderr
