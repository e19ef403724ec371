"""Fixtures of the host test bed (bed.py): beds made on demand and always
torn down, and agents (agent.py) started on their hosts."""

import os
import secrets
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository: every host sees it
sys.path.insert(0, HERE)

from agent import Remote  # noqa: E402
from bed import Bed  # noqa: E402


@pytest.fixture
def make_bed():
    why = Bed.unavailable()
    if why:
        pytest.skip(why)
    beds = []

    def make(hosts: int, rate=None) -> Bed:
        bed = Bed(hosts, rate=rate, keep=[ROOT]).__enter__()
        beds.append(bed)
        return bed

    yield make
    for bed in beds:
        bed.close()


@pytest.fixture
def agents():
    """agents(host, **init) starts an agent on host (a runtime listening on
    its address, sharing one auth token with the others); all stop after
    the test."""
    token = secrets.token_hex(16)
    started = []

    def start(host, **init) -> Remote:
        r = Remote(host, token, **init)
        started.append(r)
        return r

    yield start
    for r in started:
        r.close()
