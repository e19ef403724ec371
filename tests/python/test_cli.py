"""The rdt command (doctor, info, bench), run as real processes: through the
console script the wheel installs next to this Python, and through
``python -m rdt``."""

import ctypes
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(300)
HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "seccomp_launcher.py")
NO_GPU = not glob.glob("/dev/nvidia[0-9]*")


def _console_script():
    return shutil.which("rdt", path=os.path.dirname(sys.executable))


@pytest.fixture(params=["console-script", "python-m"])
def rdt_cmd(request):
    if request.param == "python-m":
        return [sys.executable, "-m", "rdt"]
    script = _console_script()
    if script is None:
        pytest.skip("the rdt console script is not installed next to this Python (make python-test installs "
                    "the wheel into the test virtualenv)")
    return [script]


def run(cmd, *args, timeout=120, prefix=()):
    return subprocess.run([*prefix, *cmd, *args], capture_output=True, text=True, timeout=timeout)


def doctor_json(cmd, *args, prefix=()):
    out = run(cmd, "doctor", "--json", *args, prefix=prefix)
    assert out.returncode in (0, 1), out.stderr
    return out, json.loads(out.stdout)


def test_doctor_finds_every_host_transport_working(rdt_cmd):
    out, report = doctor_json(rdt_cmd)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("cma", "shm", "tcp"):
        assert report["transports"][name]["status"] == "OK", report["transports"][name]
    assert set(report["transports"]) == {"cma", "shm", "tcp", "cuda_ipc", "nccl", "nixl"}
    assert report["automatic"]["picked"] == "cma" and report["automatic"]["fell_back_from"] == {}
    assert report["views"]["status"] == "OK", report["views"]
    assert report["peer"]["status"] == "OK" and report["peer"]["pid"] != os.getpid()
    sd = report["socket_dir"]
    assert sd["status"] == "OK" and sd["mode"] == "0o700" and sd["owner_uid"] == os.getuid()
    assert os.path.isdir(sd["path"])
    if NO_GPU:
        for name in ("cuda_ipc", "nccl"):
            t = report["transports"][name]
            assert t["status"] == "MISSING", t
            assert "/dev/nvidia* absent" in t["reason"] and t["fix"], t
        assert "nvidia-nccl-cu12" in report["transports"]["nccl"]["fix"]

    text = run(rdt_cmd, "doctor")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    for name in ("cma", "shm", "tcp"):
        assert any(line.split()[:2] == [name, "OK"] for line in lines), text.stdout
    assert "host memory -> cma" in text.stdout
    assert "shared views" in text.stdout
    if NO_GPU:
        assert any(line.split()[:2] == ["cuda_ipc", "MISSING"] for line in lines), text.stdout


def test_doctor_require_sets_the_exit_status(rdt_cmd):
    assert run(rdt_cmd, "doctor", "--require", "cma,shm").returncode == 0
    out = run(rdt_cmd, "doctor", "--require", "tcp", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["required"] == {"names": ["tcp"], "not_working": []}
    if NO_GPU:
        out = run(rdt_cmd, "doctor", "--require", "cuda_ipc")
        assert out.returncode == 1, out.stdout
        assert "required but not working: cuda_ipc" in out.stderr
    out = run(rdt_cmd, "doctor", "--require", "cma,warp_drive")
    assert out.returncode == 2 and "unknown transport warp_drive" in out.stderr
    assert run(rdt_cmd, "doctor", "--bogus-flag").returncode == 2
    assert run(rdt_cmd).returncode == 2


def test_version_prints_the_package_and_the_library_versions(rdt_cmd, tmp_path):
    import rdt
    out = run(rdt_cmd, "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"rdt {rdt.__version__} (package), library {rdt.library_version()}"
    missing = subprocess.run([*rdt_cmd, "--version"], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, RDT_LIBRARY=str(tmp_path / "nope.so")))
    assert missing.returncode == 1 and "library not loaded" in missing.stdout and "nope.so" in missing.stdout
    with open(os.path.join(HERE, "..", "..", "docs", "cli.md")) as f:
        assert f"$ rdt --version\nrdt {rdt.__version__} (package), library " in f.read()


def test_a_timeout_that_is_no_number_of_seconds_is_a_usage_error(rdt_cmd):
    for bad in ("nan", "inf", "-1", "0", "soon"):
        out = run(rdt_cmd, "doctor", "--timeout", bad)
        assert out.returncode == 2 and f"not {bad!r}" in out.stderr, out.stderr


def _under_seccomp():
    probe = subprocess.run([sys.executable, LAUNCHER, sys.executable, "-c", "pass"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode == 125:
        pytest.skip(f"cannot install a seccomp filter here: {probe.stderr.strip()}")
    assert probe.returncode == 0, probe.stderr
    return (sys.executable, LAUNCHER)


def test_doctor_with_cma_refused_by_seccomp_reports_the_reason_and_the_fallback(rdt_cmd):
    prefix = _under_seccomp()
    out, report = doctor_json(rdt_cmd, prefix=prefix)
    assert out.returncode == 0, out.stderr
    assert report["host"]["seccomp"] == 2 and report["host"]["no_new_privs"] == 1
    cma = report["transports"]["cma"]
    assert cma["status"] == "FAILED", cma
    assert "process_vm_readv" in cma["reason"] and "refused" in cma["reason"]
    assert "seccomp" in cma["fix"] and "--security-opt" in cma["fix"]
    for name in ("shm", "tcp"):
        assert report["transports"][name]["status"] == "OK"
    auto = report["automatic"]
    assert auto["first_choice"] == "cma" and auto["picked"] == "shm", auto
    assert "process_vm_readv" in auto["fell_back_from"]["cma"]

    text = run(rdt_cmd, "doctor", prefix=prefix)
    assert text.returncode == 0, text.stderr
    assert "host memory -> shm (fell back from cma, FAILED above)" in text.stdout
    assert any(line.split()[:2] == ["cma", "FAILED"] for line in text.stdout.splitlines())
    out = run(rdt_cmd, "doctor", "--require", "cma", prefix=prefix)
    assert out.returncode == 1 and "required but not working: cma" in out.stderr
    assert run(rdt_cmd, "doctor", "--require", "shm,tcp", prefix=prefix).returncode == 0


def test_a_hung_or_dead_peer_is_reported_within_the_timeout():
    from rdt._cli._peer import PeerError, PeerProcess
    with PeerProcess() as peer:
        os.kill(peer.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(PeerError, match="did not answer 'put' within 1 s; it was killed"):
            peer.request("put", 1.0, nbytes=4096)
        assert time.monotonic() - t0 < 1.0 + 5.0  # the timeout, plus reaping the killed peer
        assert peer.proc.poll() is not None
    with PeerProcess() as peer:
        peer.proc.kill()
        peer.proc.wait(timeout=30)
        with pytest.raises(PeerError, match=r"exited with status -9"):
            peer.request("put", 30.0, nbytes=4096)


def test_info_is_consistent_with_the_loaded_library(rdt_cmd):
    import rdt
    from rdt import _lib
    out = run(rdt_cmd, "info", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert os.path.isfile(d["library_path"])
    lib = ctypes.CDLL(d["library_path"])
    lib.rdt_abi_version.restype = ctypes.c_uint32
    assert d["abi_version_library"] == lib.rdt_abi_version() == d["abi_version_package"] == _lib.ABI_VERSION
    assert d["version"] == rdt.__version__ and d["library_version"] == rdt.library_version()
    assert d["build"]["go"].startswith("go1.") and d["build"]["buildmode"] == "c-shared"
    assert d["build"] == rdt.build_info()
    assert d["numpy"] and d["python"] and d["platform"]
    text = run(rdt_cmd, "info")
    assert text.returncode == 0
    fields = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in text.stdout.splitlines())
    assert fields["library path"] == d["library_path"]
    assert fields["ABI version"] == f"{d['abi_version_library']} (library), {d['abi_version_package']} (package)"
    assert fields["build go"] == d["build"]["go"]


def test_bench_with_tiny_sizes(rdt_cmd):
    out = run(rdt_cmd, "bench", "--sizes", "4K,64K", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["sizes"] == [4096, 65536] and report["errors"] == {}
    rows = {(r["transport"], r["size"]): r for r in report["rows"]}
    for name in ("cma", "shm", "tcp"):
        for size in (4096, 65536):
            r = rows[name, size]
            assert r["iterations"] >= 3 and r["p50_us"] > 0 and r["gbps"] > 0 and r["ratio"] > 0
            assert r["baseline"] == ("loopback tcp" if name == "tcp" else "memcpy")
    # Not a terminal: one progress line per step on stderr.
    assert out.stderr.count("bench: ") == len(report["rows"])

    text = run(rdt_cmd, "bench", "--sizes", "4K", "--transports", "shm")
    assert text.returncode == 0, text.stderr
    body = text.stdout.splitlines()
    assert body[0].split()[:2] == ["transport", "size"]
    assert [line.split()[:3] for line in body[2:-1]] == [["shm", "4", "KiB"]]
    assert run(rdt_cmd, "bench", "--sizes", "4X").returncode == 2
    assert run(rdt_cmd, "bench", "--transports", "carrier_pigeon").returncode == 2


def test_the_command_takes_the_transports_and_their_order_from_the_library():
    import rdt
    from rdt._cli._peer import automatic_order, builtin_transports
    with rdt.Runtime("lists", in_process=True, log_level="off") as rt:
        listed = {t["name"]: t for t in rt.transports()}
        assert listed["cma"]["same_host_only"] and listed["shm"]["same_host_only"]
        assert not listed["tcp"]["same_host_only"]
        assert automatic_order(rt, "host")[:3] == ["cma", "shm", "tcp"]
        assert all(listed[n]["auto_rank_cuda"] == 0 for n in ("cma", "shm", "tcp"))
        names = builtin_transports(rt)
        assert {"cma", "shm", "tcp", "cuda_ipc", "nixl", "nccl"} <= set(names), names
    with rdt.Runtime("bare", in_process=True, log_level="off", builtin_transports=False) as rt:
        assert builtin_transports(rt) == [] and automatic_order(rt) == []
