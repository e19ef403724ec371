"""The ``rdt`` command: ``rdt doctor``, ``rdt info`` and ``rdt bench``.

Installed as a console script (``rdt``) and run by ``python -m rdt``. Exit
status: 0, 1 when something asked for is not working (doctor --require, or
a bench row that failed), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from typing import Any, Dict, List, Optional

import rdt

from .. import _lib
from . import _bench, _doctor
from ._peer import builtin_transports


def _builtins() -> List[str]:
    """The library's built-in transports, asked of a runtime of its own."""
    with rdt.Runtime("rdt-args", log_level="off", in_process=True) as rt:
        return builtin_transports(rt)


def _transports(text: str) -> List[str]:
    return _names(text, _builtins(), "transport")


def _names(text: str, known: List[str], what: str) -> List[str]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(unknown) or repr(text)}; choose from {', '.join(known)}")
    return names


def _sizes(text: str) -> List[int]:
    try:
        sizes = [_bench.parse_size(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not sizes:
        raise argparse.ArgumentTypeError("no sizes given")
    return sizes


def _seconds(text: str) -> float:
    """A --timeout: a finite number of seconds above 0 (the command never
    waits without a bound)."""
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not 0 < t < math.inf:
        raise argparse.ArgumentTypeError(f"want a number of seconds above 0, not {text!r}")
    return t


class _Version(argparse.Action):
    """--version: prints the package's version and the library's
    (rdt_version()), and exits (1 when the library cannot be loaded); the
    library is loaded only when asked."""

    def __init__(self, option_strings: List[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        try:
            library, status = rdt.library_version(), 0
        except ImportError as e:
            library, status = f"not loaded: {e}", 1
        print(f"rdt {rdt.__version__} (package), library {library}")
        parser.exit(status)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rdt", description="rdt: direct tensor transport. Diagnose this host, "
                                "show versions, or measure the transports.")
    p.add_argument("--version", action=_Version, help="print the package's and the library's versions and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("doctor", help="which transports work on this host between two processes, and why not",
                       description="Tries every built-in transport between this process and a peer process it "
                       "starts, and reports OK, LOADED, MISSING or FAILED with the reason and the fix.")
    d.add_argument("--require", type=_transports, default=[],
                   metavar="NAMES", help="comma-separated transports that must work (exit status 1 otherwise), "
                   "e.g. cma,cuda_ipc")
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.add_argument("--timeout", type=_seconds, default=30.0, metavar="SECONDS",
                   help="longest wait on the peer process or a transfer (default 30)")

    i = sub.add_parser("info", help="versions, library path, ABI version and build facts")
    i.add_argument("--json", action="store_true", help="print as JSON")

    b = sub.add_parser("bench", help="a quick table of the transports on this host against its own limits")
    b.add_argument("--sizes", type=_sizes,
                   default=list(_bench.DEFAULT_SIZES), metavar="SIZES",
                   help="comma-separated object sizes (default 4K,1M,64M)")
    b.add_argument("--transports", type=_transports, default=None,
                   metavar="NAMES", help="comma-separated transports (default: cma, shm, tcp, and cuda_ipc "
                   "where a GPU and torch are present)")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.add_argument("--timeout", type=_seconds, default=30.0, metavar="SECONDS",
                   help="longest wait on the peer process or a transfer (default 30)")
    return p


def info() -> Dict[str, Any]:
    out: Dict[str, Any] = {"version": rdt.__version__, "library_path": os.path.abspath(_lib.library_path()),
                           "abi_version_package": _lib.ABI_VERSION}
    try:
        out["library_version"] = rdt.library_version()
        out["abi_version_library"] = int(_lib.lib().rdt_abi_version())
        out["build"] = rdt.build_info()
    except ImportError as e:
        out["library_error"] = str(e)
    try:
        import numpy
        out["numpy"] = numpy.__version__
    except ImportError:
        out["numpy"] = None
    out["python"] = f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})"
    out["platform"] = f"{platform.system()} {platform.release()} {platform.machine()}"
    try:
        out["libc"] = " ".join(platform.libc_ver()).strip() or None
    except OSError:
        out["libc"] = None
    return out


def _render_info(d: Dict[str, Any]) -> str:
    rows = [("rdt", d["version"]), ("library", d.get("library_version", "-")), ("library path", d["library_path"]),
            ("ABI version", f"{d.get('abi_version_library', '-')} (library), {d['abi_version_package']} (package)")]
    if "library_error" in d:
        rows.append(("library error", d["library_error"]))
    for key, value in d.get("build", {}).items():
        rows.append((f"build {key}", value))
    rows += [("python", d["python"]), ("numpy", d["numpy"] or "not installed"), ("platform", d["platform"]),
             ("libc", d["libc"] or "unknown")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)  # usage errors exit with status 2
    try:
        return _run(args)
    except BrokenPipeError:  # the reader (| head) went away: say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "info":
        d = info()
        print(json.dumps(d, indent=2) if args.json else _render_info(d))
        return 0 if "library_error" not in d else 1
    if args.command == "doctor":
        report = _doctor.run(timeout=args.timeout)
        failing = [n for n in args.require if report["transports"].get(n, {}).get("status") not in _doctor.WORKING]
        report["required"] = {"names": args.require, "not_working": failing}
        print(json.dumps(report, indent=2) if args.json else _doctor.render(report))
        if failing and not args.json:
            print(f"required but not working: {', '.join(failing)}", file=sys.stderr)
        return 1 if failing else 0
    report = _bench.run(args.transports, args.sizes, timeout=args.timeout)
    print(json.dumps(report, indent=2) if args.json else _bench.render(report))
    return 1 if report["errors"] else 0
