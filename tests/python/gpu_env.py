"""What a GPU test does when something it needs is missing.

Elsewhere it skips, naming what is missing. `make gpu-test` sets
RDT_REQUIRE_GPU=1 and installs everything the GPU tests use (torch's CUDA
build, CuPy, NIXL), so there a missing device, library or package fails the
test instead: a machine that cannot run them cannot pass."""

import os

import pytest


def missing(why: str) -> None:
    """Skips the calling test with why, or fails it under RDT_REQUIRE_GPU=1."""
    if os.environ.get("RDT_REQUIRE_GPU") == "1":
        pytest.fail(f"{why} (RDT_REQUIRE_GPU=1)")
    pytest.skip(why)


def cuda_torch(prefix: str, no_device: str = "torch sees none"):
    """Imports torch with a CUDA device, or calls missing() with prefix and
    what is not there: torch, or (no_device) a device."""
    try:
        import torch
    except ImportError:
        missing(f"{prefix}: torch is not installed")
    if not torch.cuda.is_available():
        missing(f"{prefix}: {no_device}")
    return torch
