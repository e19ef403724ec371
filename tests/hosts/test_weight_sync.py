"""examples/python/weight_sync.py on four bed hosts: two trainer ranks on
the head's host, three inference replicas (two tensor-parallel ranks each)
on three others, every byte checked; then the same with one replica's link
cut during a pull, which leaves that replica on the previous version and
says why, until the next step brings it up to date."""

import os
import re
import sys
import time

import pytest

pytest.importorskip("ray", reason="Ray is not installed (tests/python/requirements.txt pins it)")

from conftest import ROOT  # noqa: E402
from raycluster import RayCluster  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "python", "weight_sync.py")
pytestmark = pytest.mark.timeout(600)


def run_example(cluster, *args):
    return cluster.bed.hosts[0].spawn(
        [sys.executable, EXAMPLE, "--address", "auto", "--trainer-resource", "h0",
         "--replica-resources", "h1,h2,h3", "--check", *args], env=cluster.env)


def test_every_replica_reaches_every_version_over_tcp(make_bed):
    cluster = RayCluster(make_bed(4, rate="1gbit"))
    p = run_example(cluster, "--size-mb", "24", "--steps", "3")
    out = p.stdout.read()
    print(out)
    assert p.wait(60) == 0, out
    steps = re.findall(r"^step (\d): 6/6 ranks on version \1 in [0-9.]+ s \(([0-9.]+) MiB over ([a-z, ]+);", out, re.M)
    assert [s[0] for s in steps] == ["1", "2", "3"], out
    for _, mib, over in steps:
        assert over == "tcp", out                  # every rank is on another host than the trainers
        assert 23.9 < float(mib) / 3 < 24.2, out   # each replica's two ranks pull one model's bytes, no more
    assert out.rstrip().endswith("every byte checked"), out


def test_a_pull_cut_off_leaves_its_replica_on_the_last_version(make_bed):
    bed = make_bed(4, rate="100mbit")   # 3 x 12 MiB out of the trainers' host: 3 s a step
    cluster = RayCluster(bed)
    p = run_example(cluster, "--size-mb", "12", "--steps", "4")
    lines = []
    while True:
        line = p.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
        if line.startswith("step 1:"):
            break
    bed.wait_traffic(bed.hosts[2], 4 << 20)  # step 2's pull is on its way to replica 1
    bed.link_down(bed.hosts[2])
    time.sleep(7.0)                     # past the runtimes' 5 s peer timeout
    bed.link_up(bed.hosts[2])
    out = "".join(lines) + p.stdout.read()
    print(out)
    assert p.wait(60) == 1, out         # it exits saying how many pulls failed
    stays = re.findall(r"^  replica 1 rank (\d) stays on version (\d): pull of version (\d) failed: (\w+)", out, re.M)
    assert stays, out
    for _, on, failed, error in stays:
        assert int(on) == int(failed) - 1 and error == "PeerUnavailableError", out
    # The other replicas went on, and the cut one caught up once the link was back.
    assert re.search(r"^step 4: 6/6 ranks on version 4 ", out, re.M), out
