import multiprocessing as mp
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# rdt cannot run in a child forked after loading it; the tests spawn.
mp.set_start_method("spawn", force=True)


@pytest.fixture
def ctx():
    return mp.get_context("spawn")
