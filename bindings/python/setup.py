"""Builds librdt.so with the Go toolchain and packs it into the package.

The wheel holds no Python extension (the binding is ctypes), so it is
tagged py3-none-<platform>: one wheel for every Python 3 on the platform.
Set RDT_PREBUILT_LIBRARY to a built librdt.so to skip the Go build.
"""

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    bdist_wheel = None

HERE = Path(__file__).resolve().parent


def repo_root() -> Path:
    for p in [HERE, *HERE.parents]:
        if (p / "go.mod").exists() and (p / "capi").is_dir():
            return p
    raise SystemExit("rdt: the Go sources (go.mod, capi/) are not above bindings/python; "
                     "build from a checkout of the repository or set RDT_PREBUILT_LIBRARY")


class BuildWithGo(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib).resolve() / "rdt" / "librdt.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        prebuilt = os.environ.get("RDT_PREBUILT_LIBRARY")
        if prebuilt:
            shutil.copyfile(prebuilt, dest)
            return
        root = repo_root()
        go = shutil.which("go")
        if go is None:
            raise SystemExit("rdt: building librdt.so needs Go 1.26 on PATH (or install a prebuilt wheel)")
        cmd = [go, "build", "-buildmode=c-shared", "-trimpath",
               f"-ldflags=-extldflags=-Wl,--version-script={root / 'capi' / 'exports.map'},-soname,librdt.so",
               "-o", str(dest), "./capi"]
        subprocess.run(cmd, cwd=root, check=True)
        header = dest.with_name("librdt.h")
        if header.exists():
            header.unlink()


cmdclass = {"build_py": BuildWithGo}

if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        def get_tag(self):
            plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel



class BinaryDistribution(Distribution):
    """Holds a native library, so the wheel is platform-specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass=cmdclass, distclass=BinaryDistribution)
