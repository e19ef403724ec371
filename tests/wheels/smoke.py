"""Smoke test of an installed rdt wheel: two real processes per host transport.

    python smoke.py [--qemu]

For each of cma, shm and tcp a source process (this script with --source)
puts a numpy array over that transport and prints its pickled ref; this
process fetches it and checks every byte. It also checks that the library
loaded is the one inside the installed package. RDT_SMOKE_EXEC is a command
prefix for the source process (e.g. "qemu-aarch64 -L SYSROOT"), since a
foreign-architecture interpreter cannot start its child by itself. --qemu
says this runs under qemu-user, which lacks some system calls: a transport
that needs one it lacks is skipped, printing why (found by trying the call,
so a qemu that gains it tests the transport). Exits non-zero on any failure.
"""

import base64
import ctypes
import errno
import os
import pickle
import select
import shlex
import subprocess
import sys
from pathlib import Path

TRANSPORTS = ("cma", "shm", "tcp")
CHILD_TIMEOUT_S = 120  # qemu-user starts Python and numpy in seconds; generous for loaded machines
GET_TIMEOUT_S = 60


def payload():
    import numpy as np
    # 4 MiB with a position-dependent pattern, so a misplaced chunk shows.
    return np.arange(1 << 20, dtype=np.uint32) * np.uint32(2654435761)


def source(transport: str) -> int:
    import rdt
    ref = rdt.put(payload(), transport=transport)
    sys.stdout.write(base64.b64encode(pickle.dumps(ref)).decode() + "\n")
    sys.stdout.flush()
    # Keep the object until the fetcher says it is done (or gives up).
    ready, _, _ = select.select([sys.stdin], [], [], CHILD_TIMEOUT_S)
    if not ready:
        print(f"smoke source ({transport}): no word from the fetcher in {CHILD_TIMEOUT_S} s", file=sys.stderr)
        return 1
    sys.stdin.readline()
    return 0


def fetch_over(transport: str, child_prefix: "list[str]") -> None:
    import numpy as np
    import rdt
    cmd = [*child_prefix, sys.executable, os.path.abspath(__file__), "--source", transport]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        try:
            ready, _, _ = select.select([child.stdout], [], [], CHILD_TIMEOUT_S)
            line = child.stdout.readline() if ready else ""
            if not line:
                raise SystemExit(f"smoke: the {transport} source printed no ref within {CHILD_TIMEOUT_S} s "
                                 f"(exit status {child.poll()})")
            ref = pickle.loads(base64.b64decode(line))
            if ref.transport != transport:
                raise SystemExit(f"smoke: the ref says transport {ref.transport!r}, not {transport!r}")
            got = rdt.get(ref, timeout=GET_TIMEOUT_S, transport=transport)
            want = payload()
            if not isinstance(got, np.ndarray) or got.dtype != want.dtype or got.shape != want.shape:
                raise SystemExit(f"smoke: {transport} returned {type(got).__name__} "
                                 f"{getattr(got, 'dtype', '?')} {getattr(got, 'shape', '?')}")
            if got.tobytes() != want.tobytes():
                raise SystemExit(f"smoke: the bytes fetched over {transport} differ from those put")
            del got
            ref.close()
            child.stdin.write("done\n")
            child.stdin.flush()
            status = child.wait(timeout=CHILD_TIMEOUT_S)
            if status != 0:
                raise SystemExit(f"smoke: the {transport} source exited with status {status}")
        finally:
            if child.poll() is None:
                child.kill()
    print(f"smoke: {transport}: {want.nbytes} bytes fetched from a second process, all equal")


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def qemu_skips() -> "dict[str, str]":
    """The transports qemu-user cannot carry, with the reason: cma reads the
    source with process_vm_readv, which qemu-user (7.2) does not implement."""
    libc = ctypes.CDLL(None, use_errno=True)
    src, dst = ctypes.create_string_buffer(b"probe", 8), ctypes.create_string_buffer(8)
    local, remote = _IOVec(ctypes.addressof(dst), 5), _IOVec(ctypes.addressof(src), 5)
    if libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) < 0:
        err = ctypes.get_errno()
        return {"cma": f"process_vm_readv fails under qemu-user with {errno.errorcode.get(err, err)} "
                       f"({os.strerror(err)}): qemu does not emulate it"}
    return {}


def main(argv: "list[str]") -> int:
    if len(argv) == 2 and argv[0] == "--source":
        return source(argv[1])
    if argv not in ([], ["--qemu"]):
        raise SystemExit(__doc__)
    skips = qemu_skips() if argv else {}

    if os.environ.get("RDT_LIBRARY"):
        raise SystemExit("smoke: RDT_LIBRARY is set, so the bundled library would not be tested")
    import rdt
    from rdt import _lib
    package_dir = Path(rdt.__file__).resolve().parent
    library = Path(_lib.library_path()).resolve()
    if library != package_dir / "librdt.so" or not library.is_file():
        raise SystemExit(f"smoke: the library is {library}, not the one inside the package at {package_dir}")
    print(f"smoke: rdt {rdt.__version__}, librdt {rdt.library_version()} from {library}")
    # What the process really mapped, not only what the package meant to load.
    with open("/proc/self/maps") as maps:
        mapped = {Path(line.split()[-1]).resolve() for line in maps if line.rstrip().endswith("librdt.so")}
    if mapped != {library}:
        raise SystemExit(f"smoke: the process mapped {sorted(map(str, mapped))}, expected only {library}")

    child_prefix = shlex.split(os.environ.get("RDT_SMOKE_EXEC", ""))
    for transport in TRANSPORTS:
        if transport in skips:
            print(f"smoke: {transport}: SKIPPED: {skips[transport]}")
            continue
        fetch_over(transport, child_prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
