"""flashgqa against the attention its users would otherwise call on the CPU, timed side by side.

    python -m flashgqa.compare [--lengths 1024,2048] [--repeats 5] [--threads N] [--chart FILE.svg]

The seed measures its kernels next to JAX's production kernel (splash attention); on the CPU the real
alternatives are ``torch.nn.functional.scaled_dot_product_attention`` and
``jax.nn.dot_product_attention`` (XLA). Each is timed on the same bf16 inputs (B = 1, K = 8, G = 4,
H = 128, T = S = each length, full and causal), forward and forward + backward, as the median of
``--repeats`` runs after a warm-up. GFLOP/s count the (query, key) pairs the mask lets through,
4 B K G H FLOP each for the forward and 3.5 times that for forward + backward (FlashAttention's
convention: the backward's five matmuls to the forward's two); % of peak divides by the bf16 matmul
peak: one core's rate measured right before by flashgqa's own micro-benchmark, times the threads. A
baseline that is not installed is named and skipped.

Threads: flashgqa and torch use --threads (default: all cores); XLA sizes its own thread pool from
the cores (it cannot be set after jax starts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import flashgqa

K, G, H = 8, 4, 128


def _median_seconds(fn, repeats):
    fn()  # warm-up (and compilation for jax)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _flops(T, S, causal, backward):
    pairs = sum(min(S, t + S - T + 1) for t in range(T)) if causal else T * S
    return 4.0 * K * G * H * pairs * (3.5 if backward else 1.0)


def _flashgqa_cases(q, k, v, dout, causal, threads):
    """numpy bf16 arrays in SDPA's layout (q [1, Hq, T, H]), read in place."""
    def forward():
        flashgqa.attention(q, k, v, causal=causal, threads=threads)

    def train():
        out, lse = flashgqa.attention(q, k, v, causal=causal, threads=threads, return_lse=True)
        flashgqa.attention_backward(dout, q, k, v, out, lse, causal=causal, threads=threads)
    return forward, train


def _torch_cases(q, k, v, dout, causal, threads):
    import torch

    torch.set_num_threads(threads)
    F = torch.nn.functional
    qt, kt, vt, dt = (torch.from_numpy(x.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
                      for x in (q, k, v, dout))

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True)

    def train():
        qg, kg, vg = (x.detach().requires_grad_() for x in (qt, kt, vt))
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=True).backward(dt)
    return forward, train


def _jax_cases(q, k, v, dout, causal, threads):
    import jax
    import jax.numpy as jnp

    # jax's layout: [B, T, heads, H].
    qj, kj, vj, dj = (jnp.asarray(np.swapaxes(x, 1, 2)) for x in (q, k, v, dout))
    attend = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    fwd = jax.jit(attend)
    train_step = jax.jit(lambda q, k, v, d: jax.vjp(attend, q, k, v)[1](d))

    def forward():
        fwd(qj, kj, vj).block_until_ready()

    def train():
        jax.block_until_ready(train_step(qj, kj, vj, dj))
    return forward, train


BASELINES = {"flashgqa": (None, _flashgqa_cases), "torch SDPA": ("torch", _torch_cases),
             "jax XLA": ("jax", _jax_cases)}


def _installed(module):
    if module is None:
        return True
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def run(lengths, repeats, threads, out=None):
    """Times every installed baseline; returns (rows [(case, impl, seconds, gflops, pct)], the
    peak in FLOP/s, the names of the baselines not installed). Notes go to `out` (stdout)."""
    import ml_dtypes

    out = out or sys.stdout
    from . import _flashgqa_study

    # The peak as one core's measured rate times the threads: measured on `threads` threads inside
    # this Python process the loop does not scale past one core (the flashgqa CLI's, run from a
    # shell, does: ~2x on 2 cores); an open question, so the per-core figure is used.
    peak = threads * _flashgqa_study.bf16_peak_flops(1, 5)[0]
    missing = [name for name, (module, _) in BASELINES.items() if not _installed(module)]
    print(f"bf16 peak on {threads} threads: {peak / 1e9:.0f} GFLOP/s (one core measured now, "
          f"times {threads})", file=out)
    if missing:
        print("not installed, skipped: " + ", ".join(missing), file=out)
    rng = np.random.default_rng(0)
    rows = []
    for L in lengths:
        q = rng.standard_normal((1, K * G, L, H), dtype=np.float32).astype(ml_dtypes.bfloat16)
        k = rng.standard_normal((1, K, L, H), dtype=np.float32).astype(ml_dtypes.bfloat16)
        v = rng.standard_normal((1, K, L, H), dtype=np.float32).astype(ml_dtypes.bfloat16)
        dout = rng.standard_normal((1, K * G, L, H), dtype=np.float32).astype(ml_dtypes.bfloat16)
        for causal in (False, True):
            for name, (module, make) in BASELINES.items():
                if name in missing:
                    continue
                forward, train = make(q, k, v, dout, causal, threads)
                for kind, fn in (("forward", forward), ("forward+backward", train)):
                    seconds = _median_seconds(fn, repeats)
                    gflops = _flops(L, L, causal, kind != "forward") / seconds / 1e9
                    case = f"T=S={L} {'causal' if causal else 'full'} {kind}"
                    rows.append((case, name, seconds, gflops, 100.0 * gflops * 1e9 / peak))
    return rows, peak, missing


def table(rows):
    """A markdown table: one line per (case, implementation), with flashgqa's speed-up over each."""
    ours = {case: s for case, name, s, _, _ in rows if name == "flashgqa"}
    lines = ["| case | implementation | median ms | GFLOP/s | % of bf16 peak | flashgqa speed-up |",
             "|---|---|---:|---:|---:|---:|"]
    for case, name, s, gflops, pct in rows:
        ratio = f"{s / ours[case]:.2f}x" if name != "flashgqa" and case in ours else ""
        lines.append(f"| {case} | {name} | {s * 1e3:.1f} | {gflops:.0f} | {pct:.1f} | {ratio} |")
    return "\n".join(lines)


def svg_chart(rows, peak):
    """A horizontal bar chart of % of peak per case and implementation, as SVG text."""
    colors = {"flashgqa": "#1f77b4", "torch SDPA": "#ff7f0e", "jax XLA": "#2ca02c"}
    bar, gap, left, width = 14, 10, 330, 420
    cases = list(dict.fromkeys(case for case, *_ in rows))
    y = 40
    parts = []
    for case in cases:
        parts.append(f'<text x="4" y="{y + bar}" font-size="12">{case}</text>')
        for c, name, _, gflops, pct in rows:
            if c != case:
                continue
            w = width * min(pct, 100.0) / 100.0
            parts.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 2}" '
                         f'fill="{colors.get(name, "#888")}"/>')
            parts.append(f'<text x="{left + w + 4:.1f}" y="{y + bar - 3}" font-size="11">'
                         f'{name}: {pct:.0f}%</text>')
            y += bar
        y += gap
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 140}" height="{y + 10}">'
            f'<text x="4" y="20" font-size="14">% of the measured bf16 peak '
            f'({peak / 1e9:.0f} GFLOP/s), bf16, K=8 G=4 H=128</text>')
    return head + "".join(parts) + "</svg>\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashgqa.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1024,2048", help="T = S values, comma separated")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case (median)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chart", help="also write an SVG bar chart to this file")
    args = parser.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths: {args.lengths!r}, expected integers separated by commas")
    if any(L < 1 for L in lengths) or args.repeats < 1 or args.threads < 1:
        parser.error("--lengths, --repeats and --threads must be positive")
    rows, peak, _ = run(lengths, args.repeats, args.threads)
    print(table(rows))
    if args.chart:
        with open(args.chart, "w") as f:
            f.write(svg_chart(rows, peak))
        print(f"chart: {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
