"""A small GQA transformer trained three ways from the same initial weights: PyTorch with its SDPA,
PyTorch under torch.compile(fullgraph=True) with flashgqa's custom op, and JAX under jit with
flashgqa's XLA FFI op. The loss curves must agree (attention operands are bf16 in all three, so they
differ by bf16 roundings only), and the attention op's time per step is reported against SDPA's.

    python examples/train_gqa/train.py [--steps 50] [--seq 512]

Model: 2 layers, d_model 256, 8 query heads sharing 2 kv heads (head dim 32), RMSNorm, a ReLU MLP of
width 512, causal self-attention, vocabulary 64. Task: each sequence is random tokens whose second
half repeats the first (next-token cross-entropy over all positions), batch 4. Plain SGD.
Everything but attention runs in float32; q, k, v enter attention as bfloat16 (the seed's rule).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

VOCAB, D_MODEL, HEADS, KV_HEADS, LAYERS, MLP, BATCH, LR = 64, 256, 8, 2, 2, 512, 4, 0.1
HEAD_DIM = D_MODEL // HEADS


def init_weights(seed=0):
    """float32 numpy weights, the same for every framework."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape, scale: (rng.standard_normal(shape) * scale).astype(np.float32)  # noqa: E731
    w = {"embed": normal(VOCAB, D_MODEL, scale=0.5), "out_norm": np.ones(D_MODEL, np.float32),
         "unembed": normal(D_MODEL, VOCAB, scale=D_MODEL**-0.5)}
    for i in range(LAYERS):
        w[f"{i}.norm1"] = np.ones(D_MODEL, np.float32)
        w[f"{i}.norm2"] = np.ones(D_MODEL, np.float32)
        w[f"{i}.wq"] = normal(D_MODEL, HEADS * HEAD_DIM, scale=D_MODEL**-0.5)
        w[f"{i}.wk"] = normal(D_MODEL, KV_HEADS * HEAD_DIM, scale=D_MODEL**-0.5)
        w[f"{i}.wv"] = normal(D_MODEL, KV_HEADS * HEAD_DIM, scale=D_MODEL**-0.5)
        w[f"{i}.wo"] = normal(HEADS * HEAD_DIM, D_MODEL, scale=(HEADS * HEAD_DIM)**-0.5)
        w[f"{i}.w1"] = normal(D_MODEL, MLP, scale=D_MODEL**-0.5)
        w[f"{i}.w2"] = normal(MLP, D_MODEL, scale=MLP**-0.5)
    return w


def batches(steps, seq, seed=1):
    """[steps] int32 token batches [BATCH, seq + 1]: random first half, repeated."""
    rng = np.random.default_rng(seed)
    half = (seq + 2) // 2
    first = rng.integers(0, VOCAB, size=(steps, BATCH, half))
    return np.concatenate([first, first], axis=-1)[..., :seq + 1].astype(np.int32)


# ---- PyTorch -------------------------------------------------------------------------------------

def torch_loss_fn(attention):
    """The model's loss for `attention(q, k, v)` on [B, heads, T, head_dim] bf16 tensors (causal)."""
    import torch

    def rms(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * g

    def loss(w, tokens):
        x = w["embed"][tokens[:, :-1]]
        B, T, _ = x.shape
        for i in range(LAYERS):
            h = rms(x, w[f"{i}.norm1"])
            q = (h @ w[f"{i}.wq"]).view(B, T, HEADS, HEAD_DIM).transpose(1, 2)
            k = (h @ w[f"{i}.wk"]).view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
            v = (h @ w[f"{i}.wv"]).view(B, T, KV_HEADS, HEAD_DIM).transpose(1, 2)
            a = attention(q.bfloat16(), k.bfloat16(), v.bfloat16()).float()
            x = x + a.transpose(1, 2).reshape(B, T, HEADS * HEAD_DIM) @ w[f"{i}.wo"]
            x = x + torch.relu(rms(x, w[f"{i}.norm2"]) @ w[f"{i}.w1"]) @ w[f"{i}.w2"]
        logits = rms(x, w["out_norm"]) @ w["unembed"]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1).long())
    return loss


def sdpa_attention(q, k, v):
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def flashgqa_torch_attention(q, k, v):
    import flashgqa.torch as ft

    return ft.attention(q, k, v, causal=True)  # T = S: the default offset S - T = 0 is SDPA's


def train_torch(steps, seq, attention, compile_step=False):
    """Losses per step, and the seconds of each step."""
    import torch

    w = {n: torch.tensor(x, requires_grad=True) for n, x in init_weights().items()}
    loss_fn = torch_loss_fn(attention)
    if compile_step:
        loss_fn = torch.compile(loss_fn, fullgraph=True)
    losses, seconds = [], []
    for tokens in batches(steps, seq):
        t0 = time.perf_counter()
        loss = loss_fn(w, torch.from_numpy(tokens))
        loss.backward()
        with torch.no_grad():
            for p in w.values():
                p -= LR * p.grad
                p.grad = None
        seconds.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    return losses, seconds


# ---- JAX -----------------------------------------------------------------------------------------

def train_jax(steps, seq):
    import jax
    import jax.numpy as jnp

    import flashgqa.jax as fj

    def rms(x, g):
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g

    def loss_fn(w, tokens):
        x = w["embed"][tokens[:, :-1]]
        B, T, _ = x.shape
        for i in range(LAYERS):
            h = rms(x, w[f"{i}.norm1"])
            q = (h @ w[f"{i}.wq"]).reshape(B, T, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
            k = (h @ w[f"{i}.wk"]).reshape(B, T, KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
            v = (h @ w[f"{i}.wv"]).reshape(B, T, KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
            bf = jnp.bfloat16
            a = fj.attention(q.astype(bf), k.astype(bf), v.astype(bf), causal=True).astype(jnp.float32)
            x = x + a.transpose(0, 2, 1, 3).reshape(B, T, HEADS * HEAD_DIM) @ w[f"{i}.wo"]
            x = x + jax.nn.relu(rms(x, w[f"{i}.norm2"]) @ w[f"{i}.w1"]) @ w[f"{i}.w2"]
        logits = rms(x, w["out_norm"]) @ w["unembed"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

    @jax.jit
    def step(w, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(w, tokens)
        return loss, jax.tree.map(lambda p, g: p - LR * g, w, grads)

    w = {n: jnp.asarray(x) for n, x in init_weights().items()}
    losses, seconds = [], []
    for tokens in batches(steps, seq):
        t0 = time.perf_counter()
        loss, w = step(w, jnp.asarray(tokens))
        losses.append(float(loss))
        seconds.append(time.perf_counter() - t0)
    return losses, seconds


# ---- The attention op alone, at the model's shape --------------------------------------------------

def attention_step_seconds(seq, repeats=10):
    """Median seconds of one training step's attention work (LAYERS forward + backward calls at the
    model's shape), SDPA against flashgqa's op."""
    import torch

    rng = np.random.default_rng(2)
    make = lambda heads: torch.from_numpy(  # noqa: E731
        rng.standard_normal((BATCH, heads, seq, HEAD_DIM), dtype=np.float32)).bfloat16()
    q, k, v, dout = make(HEADS), make(KV_HEADS), make(KV_HEADS), make(HEADS)
    result = {}
    for name, attention in (("SDPA", sdpa_attention), ("flashgqa", flashgqa_torch_attention)):
        def once():
            for _ in range(LAYERS):
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                attention(qg, kg, vg).backward(dout)
        once()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
        result[name] = float(np.median(times))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seq", type=int, default=512)
    args = parser.parse_args()
    runs = {"torch SDPA": train_torch(args.steps, args.seq, sdpa_attention),
            "torch.compile + flashgqa": train_torch(args.steps, args.seq, flashgqa_torch_attention,
                                                    compile_step=True),
            "jax.jit + flashgqa.jax": train_jax(args.steps, args.seq)}
    names = list(runs)
    print("step  " + "  ".join(f"{n:>26}" for n in names))
    for s in range(args.steps):
        print(f"{s:4d}  " + "  ".join(f"{runs[n][0][s]:26.5f}" for n in names))
    base = np.array(runs[names[0]][0])
    for n in names[1:]:
        rel = np.abs(np.array(runs[n][0]) - base) / base
        print(f"{n} vs {names[0]}: max relative loss difference {rel.max():.2e}")
    for n in names:  # the first step compiles
        print(f"{n}: median step {np.median(runs[n][1][1:]) * 1e3:.1f} ms")
    t = attention_step_seconds(args.seq)
    print(f"attention per step ({LAYERS} layers, forward + backward, [{BATCH},{HEADS},{args.seq},{HEAD_DIM}] "
          f"bf16): SDPA {t['SDPA'] * 1e3:.1f} ms, flashgqa {t['flashgqa'] * 1e3:.1f} ms "
          f"({t['SDPA'] / t['flashgqa']:.2f}x)")


if __name__ == "__main__":
    main()
