"""100,000 small calls do not grow the process's memory (RSS sampled after a warm-up and at the end);
problems too large for memory raise clear errors instead of meeting the OOM killer."""
import os

import ml_dtypes
import numpy as np
import pytest

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


def test_problems_too_large_for_memory_raise_clear_errors():
    # T = S = 2^22 read through stride-0 views (no memory): naive's logits would need 2^44 floats.
    # The library refuses before allocating anything, naming the algorithm and the sizes.
    long = 2**22
    q = np.broadcast_to(np.float32(0.5), (1, 1, 1, long, 1))
    k = np.broadcast_to(np.float32(0.25), (1, 1, long, 1))
    with pytest.raises(ValueError, match=r"algorithm naive needs .* GiB of workspace, more than this "
                                         r"machine's .* GiB of memory; expected a smaller T x S"):
        flashgqa.attention(q, k, k, algo="naive")
    with pytest.raises(ValueError, match=r"algorithm chunked needs .* GiB of workspace"):
        flashgqa.attention(q, k, k, algo="chunked", block_kv=long)
