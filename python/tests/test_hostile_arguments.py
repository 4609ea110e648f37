"""Random hostile arguments from Python: every call either returns a result of q's shape or raises
ValueError / TypeError (never another exception, a crash or a hang). Arguments are drawn from a pool
of bad and good values: wrong types, 0-d to 6-d arrays, non-contiguous H, read-only and aliasing
`out`, float64 / int / bool dtypes, torch and jax arrays mixed with numpy, huge and negative integers."""
import random

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

import flashgqa

rng = np.random.default_rng(0)
Q = rng.standard_normal((1, 2, 2, 5, 16), dtype=np.float32)
K = rng.standard_normal((1, 2, 7, 16), dtype=np.float32)


def read_only(a):
    a = a.copy()
    a.setflags(write=False)
    return a


ARRAYS = [
    lambda: Q, lambda: K, lambda: Q.astype(ml_dtypes.bfloat16), lambda: Q.astype(np.float16),
    lambda: Q.astype(np.float64), lambda: Q.astype(np.int32), lambda: Q > 0, lambda: np.float32(1.0),
    lambda: np.zeros(()), lambda: np.zeros((1,) * 6, np.float32), lambda: Q[..., ::2], lambda: Q[0],
    lambda: np.zeros((1, 2, 2, 0, 16), np.float32), lambda: np.zeros((0, 2, 7, 16), np.float32),
    lambda: read_only(Q), lambda: torch.from_numpy(Q.copy()), lambda: torch.from_numpy(K.copy()),
    lambda: jnp.asarray(Q), lambda: jnp.asarray(K), lambda: [1.0, 2.0], lambda: "q", lambda: None,
    lambda: object(),
]
OPTIONS = {
    "causal": [True, False, 1, "yes", None],
    "causal_offset": [None, 0, -3, 2**63, -(2**63) - 1, 1.5, "0"],
    "scale": [None, 0.5, 0.0, float("nan"), float("inf"), -1.0, "0.5", 1e308],
    "precision": ["bf16", "f32", "fp8", None, 3],
    "algo": ["flash", "naive", "chunked", "kernel1", "chunked-unstable", "fast", None, 0],
    "block_q": [None, 0, 1, 7, -1, 2**64, 1.0],
    "block_kv": [None, 0, 1, 33, -5, 2**40],
    "threads": [None, 0, 1, 2, -1, 10**6, 2**31, "2"],
}


def record(outcomes, q, call):
    """Counts call()'s outcome: a ValueError or TypeError that says something, or a result of q's shape."""
    try:
        out = call()
    except (ValueError, TypeError) as e:
        outcomes[type(e).__name__] += 1
        assert str(e), "an error must say what was wrong"
        return
    outcomes["ok"] += 1
    assert tuple(out.shape) == tuple(np.shape(q))


def test_random_hostile_calls_raise_only_value_or_type_errors():
    pick = random.Random(14)
    outcomes = {"ok": 0, "ValueError": 0, "TypeError": 0}
    for _ in range(600):
        q, k, v = (pick.choice(ARRAYS)() for _ in range(3))
        if pick.random() < 0.4:  # often a well-formed q, k, v so the options are reached
            q, k, v = Q, K, K.copy()
        kwargs = {name: pick.choice(values) for name, values in OPTIONS.items() if pick.random() < 0.3}
        if pick.random() < 0.2:
            kwargs["out"] = pick.choice([np.empty_like(Q), read_only(Q), Q, np.empty((1, 2, 2, 5, 8), np.float32),
                                         np.empty_like(Q, dtype=np.float64)])
        record(outcomes, q, lambda: flashgqa.attention(q, k, v, **kwargs))
    assert outcomes["ok"] > 20 and outcomes["ValueError"] > 20 and outcomes["TypeError"] > 20, outcomes


# The KV-cache call: a small paged cache (3 pages of 16 keys, K = 2, H = 16) and a dense one, with
# lengths, tables, new keys and scales drawn from good and bad values alike.
KC = rng.standard_normal((3, 2, 16, 16), dtype=np.float32)
DENSE = rng.standard_normal((2, 2, 20, 16), dtype=np.float32)
QD = rng.standard_normal((2, 2, 2, 1, 16), dtype=np.float32)
KV_CACHES = [lambda: (KC.copy(), KC.copy()), lambda: (DENSE.copy(), DENSE.copy()),
             lambda: flashgqa.quantize_kv(KC)[0:1] * 2, lambda: (KC.astype(ml_dtypes.bfloat16), KC.copy()),
             lambda: (torch.from_numpy(KC.copy()), torch.from_numpy(KC.copy())),
             lambda: (jnp.asarray(KC), jnp.asarray(KC)), lambda: (KC[..., ::2].copy(), KC[..., ::2].copy()),
             lambda: (KC, "v"), lambda: (None, None)]
KV_ARGS = {
    "cache_seqlens": [[3, 17], np.array([3, 17], np.int64), np.array([3.0, 17.0]), [-1, 3], [40, 3], [3],
                      torch.tensor([3, 17]), None, "3", [2**40, 0]],
    "block_table": [None, np.array([[0, 1], [2, 0]], np.int32), np.array([[0, 1], [0, 1]], np.int32),
                    np.array([[0, 5], [2, 0]], np.int32), np.array([0, 1], np.int32), np.array([[0.0, 1.0], [2.0, 0.0]]),
                    torch.tensor([[0, 1], [2, 0]], dtype=torch.int32), [[0, 1], [2, 0]], "table"],
    "k_new": [None, rng.standard_normal((2, 2, 1, 16), dtype=np.float32), np.zeros((2, 2, 2, 16), np.float32),
              np.zeros((2, 2, 1, 16), np.float64), torch.zeros(2, 2, 1, 16), "k"],
    "k_scale": [None, np.ones((3, 2, 16), np.float32), np.ones((3, 2), np.float32), np.ones((3, 2, 16), np.float64)],
    "window": [None, (4, 0), (-1, -1), (3,), "w", (2**70, 0)],
    "softcap": [None, 3.0, -1.0, float("nan")],
    "sinks": [None, np.zeros((2, 2), np.float32), np.zeros(3, np.float32), [0.0] * 4],
    "causal_offset": [None, 0, -5, 2**63],
    "threads": [None, 1, 2, -1, 10**6],
}


def test_random_hostile_kvcache_calls_raise_only_value_or_type_errors():
    pick = random.Random(40)
    outcomes = {"ok": 0, "ValueError": 0, "TypeError": 0}
    for _ in range(500):
        caches = pick.choice(KV_CACHES)()
        kc, vc = caches if isinstance(caches, tuple) else (caches[0], caches[0])
        q = pick.choice([QD, QD.astype(ml_dtypes.bfloat16), QD[:1], torch.from_numpy(QD.copy()), Q, "q"])
        kwargs = {name: pick.choice(values) for name, values in KV_ARGS.items() if pick.random() < 0.35}
        kwargs.setdefault("cache_seqlens", [3, 17])
        if pick.random() < 0.4:  # often a well-formed paged call, so the options are reached
            q, (kc, vc) = QD, KV_CACHES[0]()
            kwargs = {name: pick.choice(values) for name, values in KV_ARGS.items() if pick.random() < 0.15}
            kwargs.setdefault("cache_seqlens", [3, 17])
            kwargs.setdefault("block_table", KV_ARGS["block_table"][1])
        if kwargs.get("k_new") is not None:
            kwargs["v_new"] = pick.choice([kwargs["k_new"], np.zeros((2, 2, 1, 16), np.float32), None])
        if kwargs.get("k_scale") is not None:
            kwargs["v_scale"] = pick.choice([kwargs["k_scale"], np.ones((3, 2, 16), np.float32), None])
        record(outcomes, q, lambda: flashgqa.attention_with_kvcache(q, kc, vc, **kwargs))
    assert outcomes["ok"] > 20 and outcomes["ValueError"] > 20 and outcomes["TypeError"] > 20, outcomes
