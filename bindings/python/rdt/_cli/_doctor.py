"""``rdt doctor``: which transports work on this host, and why not.

Every built-in transport is tried between this process and a real peer
process (:mod:`rdt._cli._peer`): the peer puts an object, this process fetches it
over that transport and checks the bytes. Where a transport is missing or
fails, the core's reason is shown with the fix for this host's cause.
"""

from __future__ import annotations

import base64
import ctypes
import glob
import os
import pickle
import re
import stat
from typing import Any, Dict, List, Optional

from .. import _errors
from ._peer import PeerError, PeerProcess, RequestError, automatic_order, builtin_transports, pattern, quiet_runtime

# Which transports there are, and the automatic choice's order, come from
# the library (rdt_transport_list); the doctor knows only the fixes.

OK, LOADED, MISSING, FAILED = "OK", "LOADED", "MISSING", "FAILED"
# What --require accepts: the bytes moved, or (nccl) the transport loaded.
WORKING = (OK, LOADED)

# An object just over 1 MiB: above the small-object fast paths.
PROBE_BYTES = (1 << 20) + 4099


# ---- facts about this host ----------------------------------------------------

def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def host_facts() -> Dict[str, Any]:
    status = _read("/proc/self/status") or ""
    fields = dict(re.findall(r"^(\w+):\s*(.*)$", status, re.M))
    yama = _read("/proc/sys/kernel/yama/ptrace_scope")
    return {
        "yama_ptrace_scope": int(yama) if yama and yama.isdigit() else None,
        "seccomp": int(fields["Seccomp"]) if fields.get("Seccomp", "").isdigit() else None,
        "no_new_privs": int(fields["NoNewPrivs"]) if fields.get("NoNewPrivs", "").isdigit() else None,
        "cma_set_ptracer": os.environ.get("RDT_CMA_SET_PTRACER", "") != "0",
        "dev_shm_writable": os.access("/dev/shm", os.W_OK | os.X_OK),
        "nvidia_devices": sorted(glob.glob("/dev/nvidia[0-9]*")),
        "cuda_driver": cuda_driver(),
    }


def cuda_driver() -> Dict[str, Any]:
    """The CUDA driver's version (cuDriverGetVersion), or why there is none."""
    name = os.environ.get("RDT_CUDA_LIBRARY") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        return {"library": name, "version": None, "error": f"no {name}: install the NVIDIA driver ({e})"}
    version = ctypes.c_int()
    try:
        rc = lib.cuDriverGetVersion(ctypes.byref(version))
    except AttributeError:
        return {"library": name, "version": None, "error": f"{name} has no cuDriverGetVersion: not a CUDA driver"}
    if rc != 0:
        return {"library": name, "version": None, "error": f"cuDriverGetVersion failed with CUDA error {rc}"}
    v = version.value
    return {"library": name, "version": f"{v // 1000}.{(v % 1000) // 10}", "error": None}


# ---- fixes ----------------------------------------------------------------------

def cma_fix(facts: Dict[str, Any]) -> str:
    if facts["seccomp"] == 2:
        return ("a seccomp filter is active (Seccomp: 2, NoNewPrivs: "
                f"{facts['no_new_privs']} in /proc/self/status), as a container's profile installs, and it refuses "
                "process_vm_readv: allow process_vm_readv and process_vm_writev in the profile (docker run "
                "--security-opt seccomp=PROFILE.json, or --cap-add SYS_PTRACE with Docker's default profile), "
                "or use shm (the automatic choice falls back to it)")
    scope = facts["yama_ptrace_scope"]
    if scope is not None and scope >= 2:
        return (f"Yama ptrace_scope is {scope} (/proc/sys/kernel/yama/ptrace_scope): set it to 1 "
                "(sudo sysctl kernel.yama.ptrace_scope=1; 3 needs a reboot); at 1 rdt calls "
                "prctl(PR_SET_PTRACER) itself so that same-user processes may read each other")
    if scope == 1 and not facts["cma_set_ptracer"]:
        return ("Yama ptrace_scope is 1 and RDT_CMA_SET_PTRACER=0 keeps rdt from calling prctl(PR_SET_PTRACER): "
                "unset RDT_CMA_SET_PTRACER")
    return ("the kernel refused ptrace access: run both processes as the same user (in a container, "
            "--cap-add SYS_PTRACE), or use shm")


SHM_FIX = ("shm needs memfd_create or a writable tmpfs at /dev/shm: mount one (docker run --shm-size=1g or "
           "--ipc=host), and allow memfd_create in a seccomp profile")
TCP_FIX = ("loopback TCP between two processes failed: check that 127.0.0.1 is up and not filtered, and "
           "RDT_LISTEN if set")


def gpu_fix(name: str, facts: Dict[str, Any]) -> str:
    if name == "nixl":
        return ("pip install nixl (rdt finds libnixl_capi.so in the installed wheel), or set RDT_NIXL_LIBRARY "
                "to the path of libnixl_capi.so")
    driver = facts["cuda_driver"]
    steps = []
    if driver["error"]:
        steps.append("install the NVIDIA driver (or set RDT_CUDA_LIBRARY to its libcuda.so.1)")
    if not facts["nvidia_devices"]:
        steps.append("no NVIDIA device (/dev/nvidia* absent): run on a GPU host (in a container: --gpus all)")
    if name == "nccl":
        steps.append("pip install nvidia-nccl-cu12 (rdt finds it in the installed wheel), or set RDT_NCCL_LIBRARY "
                     "to the path of libnccl.so.2")
    return "; ".join(steps) or "see the reason"


def fix_for(name: str, facts: Dict[str, Any]) -> str:
    """What to do on this host about a transport that is missing or failed."""
    if name == "cma":
        return cma_fix(facts)
    if name == "shm":
        return SHM_FIX
    if name == "tcp":
        return TCP_FIX
    return gpu_fix(name, facts)


# ---- the checks ----------------------------------------------------------------

def _fetch_and_check(peer: PeerProcess, rt: Any, transport: Optional[str], seed: int, timeout: float,
                     device: str = "cpu", copy: bool = True) -> None:
    """The peer puts PROBE_BYTES (put with `transport`, or for automatic
    choice with None); this process fetches them (or with copy False views
    them, read-only) and checks every byte."""
    import numpy as np
    reply = peer.request("put", timeout, nbytes=PROBE_BYTES, seed=seed, transport=transport, device=device)
    try:
        ref = pickle.loads(base64.b64decode(reply["ref"]))
        try:
            got = rt.get(ref, timeout=timeout, copy=copy)["x"]
        finally:
            ref.release()
        if device == "cuda":
            got = got.cpu().numpy()
        if not copy and got.flags.writeable:
            raise RuntimeError("the view came back writable")
        if not np.array_equal(np.asarray(got), pattern(PROBE_BYTES, seed)):
            raise RuntimeError("the fetched bytes differ from the ones put")
    finally:
        try:
            peer.request("release", timeout, key=reply["key"])
        except RequestError:
            pass


def _completed(rt: Any) -> Dict[str, int]:
    return {t["name"]: t["transfers_completed"] for t in rt.transports()}


def check_transport(name: str, rt: Any, peer: Optional[PeerProcess], peer_error: Optional[str],
                    facts: Dict[str, Any], seed: int, timeout: float) -> Dict[str, Any]:
    here = rt.transport_names()
    unavailable = rt.unavailable_transports()
    result: Dict[str, Any] = {"status": OK, "reason": None, "fix": None}
    gpu_name = name in ("cuda_ipc", "nccl")
    if name not in here:
        result.update(status=MISSING, reason=unavailable.get(name, "not registered in this runtime"),
                      fix=fix_for(name, facts))
        if gpu_name and not facts["nvidia_devices"]:
            result["reason"] = "no NVIDIA device on this host (/dev/nvidia* absent); " + result["reason"]
        return result
    if peer is None:
        result.update(status=FAILED, reason=peer_error, fix="see the peer process's error")
        return result
    if name not in peer.hello["transports"]:
        why = peer.hello["unavailable"].get(name, "not registered there")
        result.update(status=MISSING, reason=f"the peer process lacks it: {why}", fix=None)
        return result
    if name == "nccl":
        result.update(status=LOADED, reason="NCCL loaded; it moves data only within a group of GPU processes "
                      "(rdt.create_collective_group), which doctor does not form")
        return result
    device = "cuda" if name == "cuda_ipc" else "cpu"
    if device == "cuda":
        try:
            import torch
            cuda_ok = torch.cuda.is_available()
        except ImportError:
            cuda_ok = False
        if not cuda_ok:
            result.update(status=LOADED, reason="the CUDA driver loaded, but torch with CUDA is needed to put GPU "
                          "memory for a test transfer; the transport was not exercised")
            return result
    try:
        _fetch_and_check(peer, rt, name, seed, timeout, device)
    except PeerError:
        raise
    except Exception as e:
        result.update(status=FAILED, reason=str(e), fix=fix_for(name, facts))
    return result


def check_automatic(rt: Any, peer: Optional[PeerProcess], transports: Dict[str, Dict[str, Any]],
                    timeout: float) -> Dict[str, Any]:
    """Which transport a put without one is fetched with between the two
    processes, and what it fell back from."""
    order = automatic_order(rt, "host")
    expected = order[0] if order else None
    out: Dict[str, Any] = {"status": OK, "picked": None, "first_choice": expected, "fell_back_from": {}}
    if peer is None:
        out.update(status=FAILED, reason="no peer process")
        return out
    before = _completed(rt)
    try:
        _fetch_and_check(peer, rt, None, 99, timeout)
    except PeerError:
        raise
    except Exception as e:
        out.update(status=FAILED, reason=str(e))
        return out
    after = _completed(rt)
    picked = [n for n in after if after[n] > before.get(n, 0)]
    out["picked"] = picked[0] if picked else None
    for n in order:
        if n == out["picked"]:
            break
        t = transports.get(n)
        if t and t["status"] != OK:
            out["fell_back_from"][n] = t["reason"]
    return out


def check_views(rt: Any, peer: Optional[PeerProcess], timeout: float) -> Dict[str, Any]:
    """Whether this process can view the peer's object (get(copy=False)):
    the peer's shm segment mapped read-only here, every byte the put's."""
    if peer is None:
        return {"status": FAILED, "reason": "no peer process"}
    try:
        _fetch_and_check(peer, rt, None, 98, timeout, copy=False)
    except PeerError:
        raise
    except Exception as e:
        return {"status": FAILED, "reason": str(e)}
    return {"status": OK, "reason": "one copy shared by every reader on this host (shm, read-only)"}


def check_socket_dir(rt: Any) -> Dict[str, Any]:
    m = re.search(r"unix://(/[^,\s]+)", rt.address)
    if not m:
        return {"status": FAILED, "path": None, "reason": f"no Unix socket in the address {rt!r}", "fix": None}
    path = os.path.dirname(m.group(1))
    st = os.stat(path)
    out: Dict[str, Any] = {"status": OK, "path": path, "owner_uid": st.st_uid, "mode": oct(stat.S_IMODE(st.st_mode)),
                           "writable": os.access(path, os.W_OK | os.X_OK), "reason": None, "fix": None}
    problems = []
    if st.st_uid != os.getuid():
        problems.append(f"it belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
    if stat.S_IMODE(st.st_mode) != 0o700:
        problems.append(f"its mode is {out['mode']}, not 0o700")
    if not out["writable"]:
        problems.append("this user cannot create sockets in it")
    if problems:
        out.update(status=FAILED, reason="; ".join(problems),
                   fix=f"remove {path} (rdt makes it again with mode 0700), or set XDG_RUNTIME_DIR to a directory "
                       "only you can enter")
    return out


def check_tcp_listener() -> Dict[str, Any]:
    listen = os.environ.get("RDT_LISTEN") or None
    token = bool(os.environ.get("RDT_AUTH_TOKEN"))
    out: Dict[str, Any] = {"status": OK, "RDT_LISTEN": listen, "RDT_AUTH_TOKEN_set": token, "note": None}
    if listen is None:
        out["note"] = ("RDT_LISTEN is unset: runtimes listen on a Unix socket only, so other hosts cannot fetch "
                       "from them; set RDT_LISTEN=host:port (and RDT_AUTH_TOKEN for a non-loopback address)")
        return out
    host = listen.rsplit(":", 1)[0].strip("[]")
    loopback = host in ("localhost", "::1") or host.startswith("127.")
    if loopback:
        out["note"] = f"RDT_LISTEN={listen} is loopback: reachable from this host only; no token needed"
    elif token:
        out["note"] = f"RDT_LISTEN={listen} with RDT_AUTH_TOKEN set: peers must present the same token"
    else:
        out.update(status=FAILED, note=f"RDT_LISTEN={listen} is not loopback and RDT_AUTH_TOKEN is unset: a "
                   "non-loopback listener needs a token; set RDT_AUTH_TOKEN to the same secret in every process")
    return out


def run(timeout: float = 30.0) -> Dict[str, Any]:
    """Runs every check; the report is JSON-ready."""
    facts = host_facts()
    report: Dict[str, Any] = {"host": facts, "transports": {}, "automatic": None, "views": None, "socket_dir": None,
                              "tcp_listener": check_tcp_listener(), "peer": None}
    try:
        rt = quiet_runtime("rdt-doctor")
    except _errors.RdtError as e:
        report["runtime_error"] = str(e)
        return report
    report["socket_dir"] = check_socket_dir(rt)
    peer: Optional[PeerProcess] = None
    peer_error: Optional[str] = None
    try:
        peer = PeerProcess(start_timeout=timeout)
        report["peer"] = {"status": OK, "pid": peer.pid}
    except (PeerError, RequestError) as e:
        peer_error = f"the peer process could not start: {e}"
        report["peer"] = {"status": FAILED, "reason": peer_error}
    try:
        for seed, name in enumerate(builtin_transports(rt), 1):
            try:
                report["transports"][name] = check_transport(name, rt, peer, peer_error, facts, seed, timeout)
            except PeerError as e:  # the peer hung or died: the rest cannot be tried
                peer_error = str(e)
                report["peer"] = {"status": FAILED, "reason": peer_error}
                report["transports"][name] = {"status": FAILED, "reason": peer_error, "fix": None}
                peer = None
        try:
            report["automatic"] = check_automatic(rt, peer, report["transports"], timeout)
        except PeerError as e:
            report["peer"] = {"status": FAILED, "reason": str(e)}
            report["automatic"] = {"status": FAILED, "reason": str(e)}
            peer = None
        try:
            report["views"] = check_views(rt, peer, timeout)
        except PeerError as e:
            report["peer"] = {"status": FAILED, "reason": str(e)}
            report["views"] = {"status": FAILED, "reason": str(e)}
            peer = None
    finally:
        if peer is not None:
            peer.close()
    return report


# ---- output ----------------------------------------------------------------------

def render(report: Dict[str, Any]) -> str:
    lines: List[str] = []
    facts = report["host"]
    lines.append("transports (between this process and a peer process):")
    for name, t in report["transports"].items():
        lines.append(f"  {name:<9} {t['status']:<7} {t.get('reason') or ''}".rstrip())
        if t.get("fix") and t["status"] not in WORKING:
            lines.append(f"  {'':<9} {'fix:':<7} {t['fix']}")
    auto = report.get("automatic")
    if auto:
        lines.append("automatic choice (a put without a transport, fetched by the other process):")
        if auto["status"] == OK:
            line = f"  host memory -> {auto['picked']}"
            if auto["fell_back_from"]:
                line += " (fell back from " + ", ".join(
                    f"{n}, {report['transports'][n]['status']} above" for n in auto["fell_back_from"]) + ")"
            lines.append(line)
        else:
            lines.append(f"  FAILED {auto.get('reason')}")
    views = report.get("views")
    if views:
        lines.append("shared views (get(copy=False), of the other process's object):")
        lines.append(f"  {views['status']:<7} {views.get('reason') or ''}".rstrip())
    sd = report.get("socket_dir")
    if sd:
        lines.append("socket directory:")
        if sd.get("path"):
            lines.append(f"  {sd['path']}  owner uid {sd['owner_uid']}, mode {sd['mode']}, "
                         f"{'writable' if sd['writable'] else 'not writable'}  {sd['status']}")
        if sd["status"] != OK:
            lines.append(f"  {sd.get('reason')}" + (f"; fix: {sd['fix']}" if sd.get("fix") else ""))
    tcp = report["tcp_listener"]
    lines.append("tcp listener:")
    lines.append(f"  {tcp['status']:<7} {tcp['note']}")
    lines.append("host:")
    scope = facts["yama_ptrace_scope"]
    lines.append(f"  yama ptrace_scope: {'absent' if scope is None else scope}"
                 f"{'' if facts['cma_set_ptracer'] else ' (RDT_CMA_SET_PTRACER=0)'}")
    lines.append(f"  seccomp: {facts['seccomp']}, no_new_privs: {facts['no_new_privs']}")
    lines.append(f"  /dev/shm writable: {'yes' if facts['dev_shm_writable'] else 'no'}")
    lines.append(f"  nvidia devices: {', '.join(facts['nvidia_devices']) or 'none'}")
    drv = facts["cuda_driver"]
    lines.append(f"  cuda driver: {drv['version'] if drv['version'] else drv['error']}")
    peer = report.get("peer")
    if peer and peer["status"] != OK:
        lines.append(f"peer process: FAILED {peer['reason']}")
    if report.get("runtime_error"):
        lines.append(f"runtime: FAILED {report['runtime_error']}")
    return "\n".join(lines)
