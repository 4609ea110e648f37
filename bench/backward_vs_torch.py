"""The backward pass against PyTorch's CPU SDPA backward, alternated call by call in one process.

    python3 bench/backward_vs_torch.py [--calls 5] [--threads 2] [--T 4096]

Shape B=1, K=8, G=4, H=128, bf16, T = S (issue 10's benchmark). Each round times one
``flashgqa.attention_backward`` and one ``out.backward(dout)`` through
``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` (its forward is not
timed), in alternating order; prints the medians, the ratio, and flashgqa's GFLOP/s at
FlashAttention's convention (2.5x the forward's FLOP of the visible area).
"""
import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

import flashgqa


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--T", type=int, default=4096)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    B, K, G, H, T = 1, 8, 4, 128, args.T
    rng = np.random.default_rng(0)
    for causal in (False, True):
        q = torch.from_numpy(rng.standard_normal((B, K * G, T, H), dtype=np.float32)).to(torch.bfloat16)
        k = torch.from_numpy(rng.standard_normal((B, K, T, H), dtype=np.float32)).to(torch.bfloat16)
        v = torch.from_numpy(rng.standard_normal((B, K, T, H), dtype=np.float32)).to(torch.bfloat16)
        dout = torch.from_numpy(rng.standard_normal((B, K * G, T, H), dtype=np.float32)).to(torch.bfloat16)
        # flashgqa: SDPA's top-left causal mask is causal_offset=0 (T = S here, the same mask).
        out, lse = flashgqa.attention(q, k, v, causal=causal, causal_offset=0 if causal else None,
                                      threads=args.threads, return_lse=True)
        mine, theirs = [], []
        for i in range(args.calls + 1):
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                if which == 0:
                    t0 = time.perf_counter()
                    flashgqa.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                causal_offset=0 if causal else None, threads=args.threads)
                    (mine if i else []).append(time.perf_counter() - t0)
                else:
                    qt, kt, vt = (x.detach().requires_grad_() for x in (q, k, v))
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)
                    t0 = time.perf_counter()
                    o.backward(dout)
                    (theirs if i else []).append(time.perf_counter() - t0)
        m, t = statistics.median(mine), statistics.median(theirs)
        pairs = T * (T + 1) / 2 if causal else T * T
        flop = 2.5 * 4 * B * K * G * H * pairs
        print(f"backward {'causal' if causal else 'non-causal'} T=S={T}, {args.threads} threads, "
              f"{args.calls} calls each: flashgqa {m:.3f} s ({flop / m / 1e9:.0f} GFLOP/s), "
              f"torch SDPA {t:.3f} s: {t / m:.2f}x")


if __name__ == "__main__":
    main()
