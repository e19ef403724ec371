"""Runs a command under a seccomp filter that makes process_vm_readv and
process_vm_writev fail with EPERM, as a container's seccomp profile may:

    python seccomp_launcher.py COMMAND [ARGS...]

The filter is installed here (prctl PR_SET_NO_NEW_PRIVS, then
seccomp(SECCOMP_SET_MODE_FILTER) with a small BPF program that checks the
audit architecture and the syscall number) and is inherited across exec by
the command and every process it starts. Exit status 125 when the filter
cannot be installed on this host."""

import ctypes
import errno
import os
import platform
import struct
import sys

# (audit arch, process_vm_readv, process_vm_writev, seccomp) per machine.
ARCHES = {
    "x86_64": (0xC000003E, 310, 311, 317),
    "aarch64": (0xC00000B7, 270, 271, 277),
}
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
BPF_LD_W_ABS = 0x20   # BPF_LD | BPF_W | BPF_ABS: load a 32-bit word of seccomp_data
BPF_JEQ_K = 0x15      # BPF_JMP | BPF_JEQ | BPF_K
BPF_RET_K = 0x06      # BPF_RET | BPF_K
OFFSET_NR, OFFSET_ARCH = 0, 4  # in struct seccomp_data


def supported() -> bool:
    return platform.machine() in ARCHES


def install() -> None:
    arch, readv, writev, seccomp_nr = ARCHES[platform.machine()]
    program = [
        (BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),
        (BPF_JEQ_K, 0, 3, arch),                 # another arch: allow
        (BPF_LD_W_ABS, 0, 0, OFFSET_NR),
        (BPF_JEQ_K, 2, 0, readv),                # -> EPERM
        (BPF_JEQ_K, 1, 0, writev),               # -> EPERM
        (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
        (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
    ]
    filters = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(filters, len(filters))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(program), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.syscall(seccomp_nr, SECCOMP_SET_MODE_FILTER, 0, ctypes.byref(prog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")


if __name__ == "__main__":
    if not supported():
        print(f"seccomp_launcher: no filter for machine {platform.machine()}", file=sys.stderr)
        sys.exit(125)
    try:
        install()
    except OSError as e:
        print(f"seccomp_launcher: {e}", file=sys.stderr)
        sys.exit(125)
    os.execvp(sys.argv[1], sys.argv[1:])
