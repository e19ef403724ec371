"""The wheel, the sdist, and how the package finds and loads librdt.so."""

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest

pytestmark = pytest.mark.timeout(300)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PKG = os.path.join(ROOT, "bindings", "python")


def _wheel(tmp_path):
    whl = os.environ.get("RDT_WHEEL")  # make python-test builds it once
    if whl:
        return whl
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), PKG], check=True)
    return glob.glob(str(tmp_path / "rdt-*.whl"))[0]


SMOKE = textwrap.dedent("""
    import multiprocessing as mp, pickle, sys, numpy as np, rdt

    def child(conn):
        ref = pickle.loads(conn.recv())
        conn.send(rdt.get(ref)["x"].tolist())

    if __name__ == "__main__":
        assert "site-packages" in rdt.__file__, rdt.__file__
        ctx = mp.get_context("spawn")
        parent, end = ctx.Pipe()
        p = ctx.Process(target=child, args=(end,))
        p.start()
        ref = rdt.put({"x": np.arange(5.0)})
        parent.send(pickle.dumps(ref))
        assert parent.recv() == [0.0, 1.0, 2.0, 3.0, 4.0]
        p.join()
        print("smoke ok", rdt.__version__, rdt.library_version())
""")


def test_wheel_is_platform_tagged_and_installs_without_go(tmp_path):
    whl = _wheel(tmp_path)
    assert os.path.basename(whl).endswith("-py3-none-linux_x86_64.whl")
    import zipfile
    names = zipfile.ZipFile(whl).namelist()
    assert "rdt/librdt.so" in names and "rdt/py.typed" in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("RDT_LIBRARY", "PYTHONPATH", "GO", "GOROOT")}
    env["PATH"] = str(venv / "bin") + ":/usr/bin:/bin"
    assert shutil.which("go", path=env["PATH"]) is None, "go must not be on PATH for this check"
    import numpy  # from pip's cache or the index; the wheel itself needs nothing built
    subprocess.run([py, "-m", "pip", "install", "-q", whl, f"numpy=={numpy.__version__}"], check=True, env=env)
    (tmp_path / "smoke.py").write_text(SMOKE)
    out = subprocess.run([py, "smoke.py"], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "smoke ok" in out.stdout


def test_sdist_carries_the_go_sources_and_builds_a_wheel(tmp_path):
    if shutil.which("go") is None:
        pytest.skip("go is not on PATH: an sdist build needs it")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "-o", str(tmp_path), PKG], check=True,
                   capture_output=True)
    (sdist,) = glob.glob(str(tmp_path / "rdt-*.tar.gz"))
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
        tf.extractall(tmp_path / "src")
    top = os.path.commonprefix(names).split("/")[0]
    for need in ("_gosrc/go.mod", "_gosrc/capi/exports.map", "_gosrc/include/rdt.h", "_gosrc/tools/build-lib.sh",
                 "rdt/py.typed"):
        assert f"{top}/{need}" in names, need
    assert not [n for n in names if n.endswith("_test.go") or "/testdata/" in n]
    # Build the wheel from the unpacked sdist alone (no repository above it).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "out"),
                    str(tmp_path / "src" / top)], check=True)
    assert glob.glob(str(tmp_path / "out" / "rdt-*-py3-none-linux_x86_64.whl"))


def test_import_does_not_load_the_library_and_rdt_library_overrides_it(tmp_path):
    code = textwrap.dedent("""
        import rdt, rdt._lib as L
        assert not L.loaded(), "import must not load librdt.so"
        try:
            rdt.put(1)
        except ImportError as e:
            print("error:", e)
    """)
    env = dict(os.environ, RDT_LIBRARY=str(tmp_path / "nope.so"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "librdt.so not found at" in out.stdout and "nope.so" in out.stdout and "RDT_LIBRARY" in out.stdout


def test_gpu_libraries_of_installed_wheels_are_found(tmp_path):
    # A site directory laid out as the nvidia-nccl and nixl wheels install.
    site = tmp_path / "site"
    nccl = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    nixl = site / ".nixl_cu12.mesonpy.libs" / "libnixl_capi.so"
    for f in (nccl, nixl):
        f.parent.mkdir(parents=True)
        f.write_bytes(b"")
    code = textwrap.dedent("""
        import os, rdt
        rdt.library_version()  # loads the library, which looks for them first
        print(os.environ.get("RDT_NCCL_LIBRARY", "-"), os.environ.get("RDT_NIXL_LIBRARY", "-"))
    """)
    base = {k: v for k, v in os.environ.items() if k not in ("RDT_NCCL_LIBRARY", "RDT_NIXL_LIBRARY")}
    pythonpath = os.pathsep.join([str(site)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", code], env=dict(base, PYTHONPATH=pythonpath),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(nccl), str(nixl)]
    # A variable the user set wins.
    env = dict(base, PYTHONPATH=pythonpath, RDT_NCCL_LIBRARY="/opt/nccl/libnccl.so.2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["/opt/nccl/libnccl.so.2", str(nixl)]


def test_wheel_platform_tag_comes_from_rdt_wheel_platform(tmp_path):
    # make wheels packs a zig-built library under a manylinux tag this way
    # (docs/packaging.md); the packed file's content does not matter here.
    prebuilt = tmp_path / "librdt.so"
    prebuilt.write_bytes(b"stands in for librdt.so")
    # A copy, so no build/ with the stand-in is left in the repository.
    pkg = tmp_path / "pkg"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "librdt.so"))
    env = dict(os.environ, RDT_PREBUILT_LIBRARY=str(prebuilt),
               RDT_WHEEL_PLATFORM="manylinux_2_17_x86_64.manylinux2014_x86_64")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "out"), str(pkg)],
                   check=True, env=env)
    (whl,) = glob.glob(str(tmp_path / "out" / "rdt-*.whl"))
    assert os.path.basename(whl).endswith("-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    import zipfile
    with zipfile.ZipFile(whl) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
        assert zf.read("rdt/librdt.so") == prebuilt.read_bytes()
    assert "Tag: py3-none-manylinux_2_17_x86_64" in meta and "Tag: py3-none-manylinux2014_x86_64" in meta

    env["RDT_WHEEL_PLATFORM"] = "manylinux 2.17"
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "bad"), str(pkg)],
                         env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "is not a platform tag" in out.stdout + out.stderr
