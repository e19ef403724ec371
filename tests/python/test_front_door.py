"""What a newcomer meets first, followed literally: the README's commands
and snippets, the Makefile's demo and install, what an example needs, and
the doctor's sample output in the docs."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import rdt
from rdt._cli._peer import builtin_transports

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def _blocks(text, lang):
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def _need(*programs):
    for p in programs:
        if shutil.which(p) is None:
            pytest.skip(f"{p} is not on PATH")


def test_the_readme_starts_with_make_demo_and_make_test():
    first = _blocks(_read("README.md"), "sh")[0]
    assert [line.split("#")[0].strip() for line in first.splitlines()] == ["make demo", "make test"]


def test_the_readme_installs_from_the_tree_before_it_builds_wheels():
    readme = _read("README.md")
    section = readme[readme.index("## From Python and C++"):]
    assert section.index("pip install ./bindings/python") < section.index("make wheels")


def test_the_readme_ray_snippet_imports_rdt_ray():
    snippets = [b for b in _blocks(_read("README.md"), "python") if "rdt.ray." in b]
    assert snippets
    for b in snippets:
        imports = [line for line in b.splitlines() if re.match(r"(import .*\brdt\.ray\b|from rdt import ray)", line)]
        assert imports and b.index(imports[0]) < b.index("rdt.ray."), b


def test_make_demo_says_what_it_downloads_and_how_to_skip_it(tmp_path):
    _need("make")
    plan = subprocess.run(["make", "-n", "-C", ROOT, "demo", f"BUILD={tmp_path}"], capture_output=True, text=True,
                          timeout=60)
    assert plan.returncode == 0, plan.stderr
    says = plan.stdout.index("Downloading NIXL")
    assert says < plan.stdout.index("tools/install-nixl.sh"), plan.stdout  # said before it downloads
    assert "241 MB" in plan.stdout and "RDT_TEST_NIXL=0 skips the download" in plan.stdout
    skipped = subprocess.run(["make", "-n", "-C", ROOT, "demo", f"BUILD={tmp_path}", "RDT_TEST_NIXL=0"],
                             capture_output=True, text=True, timeout=60)
    assert skipped.returncode == 0 and "install-nixl" not in skipped.stdout, skipped.stdout
    assert "RDT_TEST_NIXL=0 make demo" in _read("README.md")


@pytest.mark.timeout(600)
def test_make_install_builds_and_installs_no_test(tmp_path):
    _need("make", "cmake", "go", "cc", "c++")
    build, prefix = tmp_path / "build", tmp_path / "prefix"
    out = subprocess.run(["make", "-C", ROOT, "install", f"BUILD={build}", f"PREFIX={prefix}"],
                         capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for f in ("lib/librdt.so", "include/rdt.h", "include/rdt/rdt.hpp", "lib/cmake/rdt/rdtConfig.cmake",
              "lib/pkgconfig/rdt.pc"):
        assert (prefix / f).is_file(), f
    assert not list(build.rglob("CTestTestfile.cmake")), "install configured the C and C++ tests"
    assert not list(build.rglob("tests")), "install built tests"


def test_weight_sync_says_it_needs_ray():
    example = os.path.join(ROOT, "examples", "python", "weight_sync.py")
    with open(example) as f:
        assert "It needs Ray (`pip install ray`" in f.read()
    without_ray = ("import runpy, sys; sys.modules['ray'] = None; sys.argv = [sys.argv[1]]; "
                   "runpy.run_path(sys.argv[0], run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", without_ray, example], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "Ray is not installed" in out.stderr and "pip install ray" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def _sample_transports(text):
    """The transports a doctor sample lists, in its order."""
    rows = text.split("transports (between this process and a peer process):\n", 1)[1].splitlines()
    names = []
    for row in rows:
        if not row.startswith("  "):
            break
        m = re.match(r"  ([a-z_]+)\s", row)
        if m:
            names.append(m.group(1))
    return names


def test_the_doctor_samples_list_transports_in_the_commands_order():
    with rdt.Runtime("front-door", log_level="off") as rt:
        order = builtin_transports(rt)
    assert order == sorted(order)  # by name: the same on every host
    cli = _read("docs", "cli.md")
    samples = [b for b in _blocks(cli, "") if b.startswith("$ rdt doctor")]
    samples += [b for b in _blocks(_read("README.md"), "text") if "transports (between" in b]
    assert len(samples) == 3
    for sample in samples:
        names = _sample_transports(sample)
        assert names and names == [n for n in order if n in names], sample
    assert _sample_transports(samples[0]) == order  # the full sample lists them all
