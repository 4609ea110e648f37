"""Greedy generation with a small, randomly initialised GQA transformer whose KV cache is paged
through flashgqa.attention_with_kvcache (numpy only).

Every layer keeps one page pool [num_pages, K, page_size, H] for k and one for v; each sequence owns
the pages its block_table row lists (handed out as it grows, from a shuffled free list, as a serving
engine would). Prompts of different lengths are prefilled in chunks of up to 16 tokens (chunked
prefill: T new tokens per call, causal bottom-right within each sequence), then each step feeds one
token per sequence and appends its k, v in the same call. The weights are random, so the tokens are
nonsense; the point is the cache traffic and the tokens/s. --kv-dtype picks the page pools' dtype:
float32 (the default), bfloat16 or float16 (the new k, v are rounded to it before the call writes
them), or int8 with a float32 scale per key (flashgqa.quantize_kv's format: the call quantizes the
appended k, v itself).

    python examples/generate/generate.py --batch 4 --new-tokens 64 [--kv-dtype bfloat16|float16|int8]
"""
import argparse
import os
import time

# The model's matmuls are tiny: BLAS threads would only spin against the attention's threads on a
# small machine (10x slower here). Set these yourself to measure otherwise.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import flashgqa  # noqa: E402


class Model:
    def __init__(self, rng, vocab, layers, K, G, H):
        d = K * G * H
        self.K, self.G, self.H, self.layers = K, G, H, layers
        init = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)  # noqa: E731
        self.embed = (init(vocab, d) * np.sqrt(vocab)).astype(np.float32)
        self.wq = [init(d, d) for _ in range(layers)]
        self.wk = [init(d, K * H) for _ in range(layers)]
        self.wv = [init(d, K * H) for _ in range(layers)]
        self.wo = [init(d, d) for _ in range(layers)]
        self.w1 = [init(d, 4 * d) for _ in range(layers)]
        self.w2 = [init(4 * d, d) for _ in range(layers)]
        self.unembed = init(d, vocab)


def line_aligned_zeros(shape, dtype, align=64):
    """Zeros whose data starts on a cache line, as torch and JAX allocate theirs. numpy's own large
    arrays start 16 bytes past one, so every row of a cache there straddles two lines and each load
    of it reads both (page 16 1.15-1.3x slower on Zen 4, docs/performance.md, session 31)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(nbytes + align, np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


# --kv-dtype: the page pools' numpy dtypes (bfloat16 from ml_dtypes, as flashgqa takes it).
KV_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "int8": np.int8}


class PagedCache:
    """Per layer a k and a v page pool; per sequence a row of the block table."""

    def __init__(self, rng, model, batch, max_len, page_size, kv_dtype="float32"):
        self.page_size = page_size
        self.max_pages = -(-max_len // page_size)
        num_pages = batch * self.max_pages
        shape = (num_pages, model.K, page_size, model.H)
        self.k = [line_aligned_zeros(shape, KV_DTYPES[kv_dtype]) for _ in range(model.layers)]
        self.v = [line_aligned_zeros(shape, KV_DTYPES[kv_dtype]) for _ in range(model.layers)]
        scales = kv_dtype == "int8"  # a float32 scale per (page, kv head, row)
        self.k_scale = [np.zeros(shape[:-1], np.float32) if scales else None for _ in range(model.layers)]
        self.v_scale = [np.zeros(shape[:-1], np.float32) if scales else None for _ in range(model.layers)]
        self.free = list(rng.permutation(num_pages))
        self.table = np.zeros((batch, self.max_pages), np.int32)
        self.pages = [0] * batch
        self.seqlens = np.zeros(batch, np.int32)

    def reserve(self, b, length):
        """Pages for `length` keys of sequence b."""
        while self.pages[b] * self.page_size < length:
            self.table[b, self.pages[b]] = self.free.pop()
            self.pages[b] += 1


def rms_norm(x):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)


THREADS = 1  # --threads


def forward(model, cache, tokens):
    """tokens [B, T] (T new tokens per sequence, all at their sequences' ends): logits of the last."""
    B, T = tokens.shape
    K, G, H = model.K, model.G, model.H
    for b in range(B):
        cache.reserve(b, cache.seqlens[b] + T)
    x = model.embed[tokens]  # [B, T, d]
    for i in range(model.layers):
        h = rms_norm(x)
        q = (h @ model.wq[i]).reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, H]
        k = np.ascontiguousarray((h @ model.wk[i]).reshape(B, T, K, H).transpose(0, 2, 1, 3))
        v = np.ascontiguousarray((h @ model.wv[i]).reshape(B, T, K, H).transpose(0, 2, 1, 3))
        if cache.k[i].dtype != np.int8:  # a float cache takes k_new, v_new in its own dtype
            k, v = k.astype(cache.k[i].dtype), v.astype(cache.v[i].dtype)
        o = flashgqa.attention_with_kvcache(q, cache.k[i], cache.v[i], cache_seqlens=cache.seqlens,
                                            block_table=cache.table, k_new=k, v_new=v,
                                            k_scale=cache.k_scale[i], v_scale=cache.v_scale[i],
                                            threads=THREADS)
        x = x + o.transpose(0, 3, 1, 2, 4).reshape(B, T, -1) @ model.wo[i]
        x = x + np.maximum(rms_norm(x) @ model.w1[i], 0) @ model.w2[i]
    cache.seqlens += T
    return rms_norm(x[:, -1]) @ model.unembed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=16, help="prefill tokens per call (T)")
    ap.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="float32",
                    help="the page pools' dtype (int8: quantized as they are appended)")
    ap.add_argument("--threads", type=int, default=1,
                    help="attention threads (a model this small gains nothing from more: each call is tiny)")
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads
    rng = np.random.default_rng(0)
    model = Model(rng, vocab=512, layers=2, K=2, G=4, H=64)
    prompt_lens = [int(n) for n in rng.integers(8, 200, size=args.batch)]
    cache = PagedCache(rng, model, args.batch, max(prompt_lens) + args.new_tokens + args.chunk, args.page_size,
                       args.kv_dtype)
    prompts = rng.integers(0, 512, size=(args.batch, max(prompt_lens)))

    # Chunked prefill, one sequence at a time (a call takes one T for all its sequences): up to
    # --chunk tokens per call, each chunk causal within itself and attending to the cached ones.
    t0 = time.perf_counter()
    last = np.zeros(args.batch, dtype=int)
    for b, n in enumerate(prompt_lens):
        view = PagedCacheView(cache, [b])
        for start in range(0, n, args.chunk):
            logits = forward(model, view, prompts[b:b + 1, start:min(n, start + args.chunk)])
        view.commit()
        last[b] = int(np.argmax(logits[0]))
    prefill = time.perf_counter() - t0

    t0 = time.perf_counter()
    out = [[int(t)] for t in last]
    tokens = last
    for _ in range(args.new_tokens - 1):
        tokens = np.argmax(forward(model, cache, tokens[:, None]), axis=-1)
        for b in range(args.batch):
            out[b].append(int(tokens[b]))
    decode = time.perf_counter() - t0
    print(f"prompts {prompt_lens}: prefill {sum(prompt_lens)} tokens in {prefill * 1e3:.1f} ms")
    print(f"decode: {args.batch} x {args.new_tokens - 1} tokens in {decode * 1e3:.1f} ms = "
          f"{args.batch * (args.new_tokens - 1) / decode:.1f} tokens/s (cache lengths {[int(n) for n in cache.seqlens]})")
    print("first tokens:", [o[:8] for o in out])


class PagedCacheView:
    """Some sequences of a PagedCache as a cache of their own (the same page pools)."""

    def __init__(self, cache, rows):
        self.parent, self.rows = cache, rows
        self.k, self.v, self.page_size, self.max_pages = cache.k, cache.v, cache.page_size, cache.max_pages
        self.k_scale, self.v_scale = cache.k_scale, cache.v_scale
        self.table = np.ascontiguousarray(cache.table[rows])
        self.seqlens = cache.seqlens[rows].copy()

    def reserve(self, j, length):
        self.parent.reserve(self.rows[j], length)
        self.table[j] = self.parent.table[self.rows[j]]

    def commit(self):
        self.parent.seqlens[self.rows] = self.seqlens


if __name__ == "__main__":
    main()
