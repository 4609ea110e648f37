"""The GPU peer of flashgqa_cuda_bench: PyTorch's scaled_dot_product_attention on the same workloads
(bf16, q [B, K*G, T, H], k/v [B, K, S, H]), each backend PyTorch has for it, beside torch.matmul's
bf16 8192^3 product. TFLOP/s of the median of 30 launches (CUDA events, after 5 warm-ups), FLOPs
counted as flashgqa_cuda_bench counts them (4 B K G H x visible pairs). Where a backend refuses GQA
(enable_gqa), it runs on k/v expanded to K*G heads, and the line says so.

    python3 bench/cuda_sdpa_peer.py
"""
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# B, K, G, T, S, H, causal: flashgqa_cuda_bench's. SDPA's is_causal is top-left and flashgqa's default
# bottom-right: the same mask only because T = S in every workload here.
WORKLOADS = [
    (1, 8, 4, 4096, 4096, 128, False),
    (1, 8, 4, 4096, 4096, 128, True),
    (1, 8, 4, 4096, 4096, 64, False),
    (1, 8, 4, 4096, 4096, 256, False),
    (4, 8, 4, 4096, 4096, 128, False),
    (1, 8, 4, 16384, 16384, 128, True),
]
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def median_ms(fn, reps=30):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = [start.elapsed_time(end) for start, end in pairs]
    return statistics.median(times), min(times), max(times)


def gemm(n=8192):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    med, lo, hi = median_ms(lambda: a @ b)
    tflops = 2 * n**3 / (med * 1e-3) / 1e12
    print(f"torch gemm bf16 {n}^3: median {med:.3f} ms [{lo:.3f}, {hi:.3f}] = {tflops:.1f} TFLOP/s", flush=True)
    return tflops


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    peak = gemm()
    for B, K, G, T, S, H, causal in WORKLOADS:
        q = torch.randn(B, K * G, T, H, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, K, S, H, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, K, S, H, device="cuda", dtype=torch.bfloat16)
        pairs = sum(min(max(t + S - T + 1, 0), S) for t in range(T)) if causal else T * S
        flops = 4 * B * K * G * H * pairs
        for backend in BACKENDS:
            how = "gqa"
            try:
                with sdpa_kernel(backend):
                    call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
                    call()
            except RuntimeError:
                ke, ve = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
                how = "k/v expanded"
                try:
                    with sdpa_kernel(backend):
                        call = lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)
                        call()
                except RuntimeError as e:
                    print(f"sdpa {backend.name} B{B} K{K} G{G} T{T} S{S} H{H}: refused ({str(e).splitlines()[0][:80]})")
                    continue
            with sdpa_kernel(backend):
                med, lo, hi = median_ms(call)
            tflops = flops / (med * 1e-3) / 1e12
            print(f"sdpa {backend.name:19s} B{B} K{K} G{G} T{T} S{S} H{H} {'causal' if causal else 'full':6s} ({how}): "
                  f"median {med:.3f} ms [{lo:.3f}, {hi:.3f}] = {tflops:.1f} TFLOP/s = {100 * tflops / peak:.1f}% of "
                  f"torch's GEMM", flush=True)


if __name__ == "__main__":
    main()
