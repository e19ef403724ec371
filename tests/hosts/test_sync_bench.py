"""bench/sync_bench.py (make bench-sync) still runs: every method and the
fan-out once, on a model of a few MiB, its table written."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("ray", reason="Ray is not installed (tests/python/requirements.txt pins it)")
pytest.importorskip("torch", reason="the gloo rows need torch; torch is not installed")


@pytest.mark.timeout(600)
def test_the_sync_bench_runs_every_method(make_bed, tmp_path):
    make_bed(1)  # skips without root, as the bench would refuse
    out, data = tmp_path / "SYNC.md", tmp_path / "sync.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sync_bench.py"), "--sizes", "0.01", "--runs",
                        "1", "--fanout-size", "0.01", "--out", str(out), "--json", str(data)],
                       capture_output=True, text=True, timeout=540)
    assert p.returncode == 0, p.stdout + p.stderr
    table = out.read_text()
    row = [line for line in table.splitlines() if line.startswith("| 0.01 GB |")]
    assert len(row) == 1 and "–" not in row[0], table   # rdt, Ray and gloo each measured
    assert "| 8 | " in table, table
