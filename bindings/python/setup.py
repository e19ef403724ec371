"""Builds librdt.so with the Go toolchain and packs it into the package.

The wheel holds no Python extension (the binding is ctypes), so it is tagged
py3-none-<platform>: one wheel for every Python 3 on the platform, which
installs without Go.

* ``pip install ./bindings/python`` / ``pip wheel ./bindings/python`` and
  ``python -m build --wheel`` build from the repository: the library is
  built by tools/build-lib.sh, the recipe the Makefile and CMake run too.
* ``python -m build`` (sdist, then a wheel from it) works too: the sdist
  carries the Go sources in ``_gosrc/``.
* ``RDT_PREBUILT_LIBRARY=/path/librdt.so`` skips the Go build; ``GO`` names
  the go binary (default: ``go`` on PATH).
* ``RDT_WHEEL_PLATFORM`` sets the wheel's platform tag, e.g.
  ``manylinux_2_17_x86_64.manylinux2014_x86_64`` for the manylinux wheels
  that ``make wheels`` builds (docs/packaging.md); unset, it is this
  machine's platform.
"""

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    bdist_wheel = None

HERE = Path(__file__).resolve().parent
GO_DIRS = ("capi", "core", "transports")
BUILD_SCRIPT = "tools/build-lib.sh"
GO_FILES = ("go.mod", "go.sum", "include/rdt.h", BUILD_SCRIPT)


def go_root() -> Path:
    """Where go.mod, capi/ and the build script are: the repository, or the sdist's copy."""
    for p in [HERE / "_gosrc", *HERE.parents]:
        if (p / "go.mod").exists() and (p / "capi").is_dir() and (p / BUILD_SCRIPT).is_file():
            return p
    raise SystemExit("rdt: the Go sources (go.mod, capi/) are neither above bindings/python nor in _gosrc/; "
                     "build from a checkout of the repository or an sdist, or set RDT_PREBUILT_LIBRARY")


def go_sources(root: Path):
    """The files the build script needs (no tests, no test data)."""
    for name in GO_FILES:
        yield Path(name)
    for d in GO_DIRS:
        for p in sorted((root / d).rglob("*")):
            rel = p.relative_to(root)
            if not p.is_file() or "testdata" in rel.parts or p.name.endswith("_test.go"):
                continue
            if p.suffix in (".go", ".c", ".h", ".map", ".s"):
                yield rel


class BuildWithGo(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib).resolve() / "rdt" / "librdt.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        # A library left by an earlier build (another architecture, a packed
        # prebuilt file) would make go build refuse to write over it.
        dest.unlink(missing_ok=True)
        prebuilt = os.environ.get("RDT_PREBUILT_LIBRARY")
        if prebuilt:
            shutil.copyfile(prebuilt, dest)
            return
        root = go_root()
        go = os.environ.get("GO") or shutil.which("go")
        if go is None:
            raise SystemExit("rdt: building librdt.so needs Go 1.26 on PATH (or GO=/path/to/go); a built wheel "
                             "installs without it")
        # The one build recipe, which the Makefile and CMake run too.
        env = dict(os.environ, GO=go)
        subprocess.run(["sh", str(root / BUILD_SCRIPT), str(dest)], cwd=root, check=True, env=env)


class SdistWithGo(sdist):
    """Adds the Go sources to the sdist, so a wheel builds from it alone."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = go_root()
        for rel in go_sources(root):
            target = Path(base_dir) / "_gosrc" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, target)


cmdclass = {"build_py": BuildWithGo, "sdist": SdistWithGo}

if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        """py3-none-<platform>: any Python 3, this OS and architecture (or RDT_WHEEL_PLATFORM)."""

        def get_tag(self):
            plat = os.environ.get("RDT_WHEEL_PLATFORM")
            if plat:
                # One platform tag or a compressed set (tag.tag), as in wheel file names.
                if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)*", plat):
                    raise SystemExit(f"rdt: RDT_WHEEL_PLATFORM={plat!r} is not a platform tag such as "
                                     "manylinux_2_17_x86_64")
                return "py3", "none", plat
            plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel


class BinaryDistribution(Distribution):
    """Holds a native library, so the wheel is platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass=cmdclass, distclass=BinaryDistribution)
