"""bench/peers.py (`make bench-peers`): its arguments, its table and its
targets, and two peers run end to end on tiny shapes. Nothing here times
anything: the figures in the synthetic rows are made up."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PEERS_PY = os.path.join(ROOT, "bench", "peers.py")


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("peers", PEERS_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shapes_parse_and_format_round_trip(peers):
    shapes = peers.parse_shapes("4KiB:300,1MiB:40,1GiB:3,1024x4KiB:10,4096x64KiB")
    assert shapes == [(1, 4096, 300), (1, 1 << 20, 40), (1, 1 << 30, 3), (1024, 4096, 10),
                      (4096, 64 << 10, 3)]
    assert peers.format_shapes(shapes) == "4KiB:300,1MiB:40,1GiB:3,1024x4KiB:10,4096x64KiB:3"
    # rdtbench row takes the same names.
    assert [peers.shape_name(c, s) for c, s, _ in peers.SHAPES] == [
        "4KiB", "1MiB", "64MiB", "1GiB", "1024x4KiB", "4096x64KiB"]


def test_report_gives_ratios_targets_and_why_a_peer_is_missing(peers):
    shapes = [(1, 4096, 3), (1, 64 << 20, 3), (1, 1 << 30, 3)]
    t = peers.PEER_TITLES
    rows = {
        "rdt, automatic choice": {"4KiB": 10e-6, "64MiB": 0.005, "1GiB": 0.08, "by": "cma"},
        "rdt, tcp": {"4KiB": 40e-6, "64MiB": 0.02, "1GiB": 0.3, "by": "tcp"},
        t["mooncake"]: {"4KiB": 100e-6, "64MiB": 0.04, "1GiB": 0.6, "version": "m 1"},
        t["nixl"]: {"unavailable": "cannot import nixl_cu12"},
        t["gloo"]: {"4KiB": 1e-3, "64MiB": 0.05, "1GiB": 1.0, "version": "torch 2"},
        t["shared_memory"]: {"4KiB": 50e-6, "64MiB": 0.008, "1GiB": 0.2, "version": "numpy 2"},
    }
    text = peers.report(shapes, rows)
    assert f"| {t['nixl']} | not measured: cannot import nixl_cu12 |" in text
    assert "| rdt, tcp (tcp) | 40.0 µs<br>0.10 GB/s |" in text
    # Mooncake's time over rdt's: 0.04 / 0.005 = 8x (automatic), 0.04 / 0.02 = 2x (tcp).
    assert f"| {t['mooncake']} | automatic | 10.00x | 8.00x | 7.50x |" in text
    assert f"| {t['mooncake']} | tcp | 2.50x | 2.00x | 2.00x |" in text
    assert "| rdt over tcp >= 1.5x Mooncake's tcp at 64MiB and 1GiB | 2.00x / 2.00x | yes |" in text
    assert "| rdt's automatic choice >= 5x Mooncake's tcp at 64MiB and 1GiB | 8.00x / 7.50x | yes |" in text
    # A peer that was not measured cannot meet its target.
    assert "| rdt's automatic choice >= 2x NIXL used directly at 64MiB and 1GiB | – / – | **no** |" in text
    assert "| rdt (automatic) >= 5x gloo at 64 MiB | 10.00x | yes |" in text
    assert "| rdt (automatic) >= 2x the shared-memory copy at 64 MiB | 1.60x | **no** |" in text
    assert "| rdt tcp 4 KiB latency <= half of Mooncake's tcp latency | 2.50x | yes |" in text


def test_quick_run_measures_two_peers_and_says_why_one_is_missing(tmp_path):
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "why").write_text("cannot download libibverbs1_44.0-2_amd64.deb\n")
    out = tmp_path / "PEERS.md"
    proc = subprocess.run(
        [sys.executable, PEERS_PY, "--quick", "--rdt", "none", "--peers", "pickle,shared_memory,mooncake",
         "--mooncake-libs", str(libs), "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "| system | 4 KiB | 64 KiB | 8 × 4 KiB |" in text
    for title in ("pickle over a multiprocessing pipe", "multiprocessing.shared_memory + numpy copies"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {title} ("))
        assert row.count("GB/s") == 3, row
    assert ("| Mooncake Transfer Engine, tcp | not measured: Debian's libibverbs1, which its engine.so "
            "links, could not be unpacked: cannot download libibverbs1_44.0-2_amd64.deb |") in text


def test_rdt_from_python_runs_as_the_peers_do_and_gets_ratios(tmp_path, peers):
    # End to end on tiny shapes: rdt's rows from Python move (and check)
    # every shape, the prepared get as well.
    out = tmp_path / "PEERS.md"
    proc = subprocess.run(
        [sys.executable, PEERS_PY, "--quick", "--rdt", "none", "--peers", "pickle,rdt-py-auto,rdt-py-prepared",
         "--write-shapes", "none", "--torch-python", sys.executable, "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    for name in ("rdt-py-auto", "rdt-py-prepared"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {peers.PEER_TITLES[name]} (rdt "))
        assert row.count("GB/s") == 3, row
    # The peers' ratios against those rows, beside the C ones.
    t = peers.PEER_TITLES
    rows = {
        "rdt, automatic choice": {"4KiB": 10e-6, "by": "cma"},
        t["rdt-py-auto"]: {"4KiB": 20e-6, "version": "rdt 0"},
        t["nixl"]: {"4KiB": 5e-6, "version": "n 1"},
    }
    text = peers.report([(1, 4096, 3)], rows)
    assert f"| {t['nixl']} | automatic | 0.50x |" in text
    assert f"| {t['nixl']} | automatic, from Python | 0.25x |" in text
    assert "prepared, from Python" not in text  # not measured: no row
