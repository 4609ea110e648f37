"""Shared setup: JAX runs on the CPU (it runs the seed's functions), seeded random inputs."""
import os
import zlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id, so every test sees its own fixed inputs."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
