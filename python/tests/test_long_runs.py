"""100,000 small calls do not grow the process's memory (RSS sampled after a warm-up and at the end)."""
import os

import ml_dtypes
import numpy as np

import flashgqa


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_100k_small_calls_keep_memory_flat():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 2, 3, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((1, 2, 17, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
    out = np.empty_like(q)

    def calls(n):
        for i in range(n):
            flashgqa.attention(q, k, k, out=out, causal=i % 2 == 0, threads=1)

    calls(10_000)  # warm-up: allocator pools, thread pool, caches
    before = rss_bytes()
    calls(90_000)
    after = rss_bytes()
    # A leak of even 16 bytes per call would add ~1.4 MB; allow 1 MB of allocator noise.
    assert after - before < (1 << 20), (before, after)
