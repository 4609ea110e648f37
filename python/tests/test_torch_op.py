"""torch.ops.flashgqa.attention and attention_backward (flashgqa.torch): opcheck, autograd,
torch.compile(fullgraph=True), the options and layouts through the op, and the ImportError without
torch. The drop-in scaled_dot_product_attention is tested in test_torch_sdpa_dropin.py.

The op calls flashgqa.attention / attention_backward, which the other files check against the
float64 reference, the seed and SDPA: here the op's results must be those calls' bits (plumbing),
and gradients through autograd are judged against the float64 gradients by backward_bounds.py.
Compiled functions must give eager's bits: the op is deterministic and the compiled graph calls
the same kernels.
"""
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.library import opcheck

import flashgqa
import flashgqa.torch as ft
from backward_bounds import BackwardReference, flashgqa_side
from error_bounds import as_f64
from test_backward import check

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ALL_OPCHECKS = ("test_schema", "test_autograd_registration", "test_faketensor",
                "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def randn(rng, shape, dtype="float32", requires_grad=False):
    x = torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(TORCH_DTYPES[dtype])
    return x.requires_grad_(requires_grad)


def cu(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)


def same_bits(a, b):
    """Same shape, dtype and bits (NaN equal to itself, -0 not equal to 0)."""
    ints = {4: torch.int32, 2: torch.int16}
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.detach().view(ints[a.element_size()]),
                            b.detach().view(ints[b.element_size()])))


def op_args(case, rng, requires_grad=False):
    """q, k, v and the op's options for a case (layout, B, K, G, T, S, H, dtype, options)."""
    layout, B, K, G, T, S, H, dtype, options = case
    q_shape = {"5d": (B, K, G, T, H), "4d": (B, K * G, T, H), "3d": (T, K * G, H)}[layout]
    kv_shape = (S, K, H) if layout == "3d" else (B, K, S, H)
    q, k, v = (randn(rng, s, dtype, requires_grad) for s in (q_shape, kv_shape, kv_shape))
    options = dict(options)
    if "sinks" in options:  # learned: a leaf like q, k, v
        options["sinks"] = options["sinks"].clone().requires_grad_(requires_grad)
    return q, k, v, options


def op_options(causal=False, causal_offset=None, window=(-1, -1), scale=None, precision="bf16",
               cu_seqlens_q=None, cu_seqlens_k=None, softcap=0.0, sinks=None):
    """The op's positional options (schema order) from flashgqa.attention's keywords."""
    return (causal, causal_offset, window[0], window[1], scale, precision, cu_seqlens_q,
            cu_seqlens_k, softcap, sinks)


PACKED = dict(cu_seqlens_q=cu([5, 0, 9]), cu_seqlens_k=cu([7, 4, 12]))
# (layout, B, K, G, T, S, H, dtype, options)
CASES = [
    ("4d", 1, 2, 3, 7, 9, 16, "float32", dict(causal=True, causal_offset=0, precision="f32")),
    ("4d", 2, 2, 1, 9, 5, 32, "bfloat16", dict()),
    ("4d", 1, 1, 4, 12, 12, 8, "bfloat16", dict(window=(3, 1), causal_offset=0)),
    ("5d", 2, 1, 2, 6, 11, 16, "float32", dict(causal=True, precision="f32")),
    ("5d", 1, 2, 1, 8, 3, 64, "bfloat16", dict(causal=True, scale=0.3)),
    ("3d", 1, 2, 2, 14, 23, 16, "float32", dict(causal=True, window=(4, -1), precision="f32",
                                                **PACKED)),
    ("4d", 1, 2, 2, 10, 13, 32, "bfloat16", dict(causal=True, softcap=2.0, scale=1.0)),
    ("5d", 1, 2, 3, 9, 14, 16, "float32", dict(causal=True, causal_offset=-2, precision="f32",
                                               sinks=torch.linspace(-1.0, 2.0, 6).reshape(2, 3))),
]


def case_id(case):
    return "{}-B{}K{}G{}T{}S{}H{}-{}-".format(*case[:8]) + "-".join(sorted(case[8]))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_opcheck_forward_and_backward(rng, case):
    # Schema, autograd registration, fake kernels against the real ones, and AOT dispatch
    # (static and dynamic shapes, with gradients for the forward), each compared with eager at
    # rtol = atol = 0: the library gives the same bits for the same inputs.
    q, k, v, options = op_args(case, rng, requires_grad=True)
    args = (q, k, v, *op_options(**options))
    result = opcheck(torch.ops.flashgqa.attention.default, args, test_utils=ALL_OPCHECKS,
                     rtol=0, atol=0)
    assert set(result.values()) == {"SUCCESS"}, result

    plain = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in args[3:])
    out, lse = torch.ops.flashgqa.attention(*(x.detach() for x in (q, k, v)), *plain)
    dout = torch.randn_like(out)
    bargs = (dout, q.detach(), k.detach(), v.detach(), out, lse, *plain)  # (no double backward)
    result = opcheck(torch.ops.flashgqa.attention_backward.default, bargs,
                     test_utils=ALL_OPCHECKS, rtol=0, atol=0)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_op_gives_the_library_bits_and_gradients(rng, case):
    # Every layout and option reaches flashgqa.attention / attention_backward unchanged: out, lse
    # and the autograd gradients are those calls' bits. lse: float32, q's shape without H, and no
    # gradient.
    q, k, v, options = op_args(case, rng, requires_grad=True)
    out, lse = ft.attention(q, k, v, return_lse=True, **options)
    want_out, want_lse = flashgqa.attention(q, k, v, return_lse=True, **options)
    assert same_bits(out, want_out) and same_bits(lse, want_lse)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    assert out.requires_grad and not lse.requires_grad

    dout = torch.randn_like(out)
    out.backward(dout)
    want = flashgqa.attention_backward(dout, q, k, v, want_out, want_lse, **options)
    for name, x, w in zip(("dq", "dk", "dv", "dsinks"), (q, k, v, options.get("sinks")), want):
        assert same_bits(x.grad, w), name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_autograd_gradients_against_float64(rng, dtype, causal):
    # Gradients through the op's autograd (the default flash forward: up to S running-max
    # corrections in its out and lse) within flashgqa's bound against the exact float64 ones.
    B, K, G, T, S, H = 1, 2, 3, 21, 34, 32
    precision = "f32" if dtype == "float32" else "bf16"
    q, dout = randn(rng, (B, K * G, T, H), dtype, True), randn(rng, (B, K * G, T, H), dtype)
    k, v = (randn(rng, (B, K, S, H), dtype, True) for _ in range(2))
    ft.attention(q, k, v, causal=causal, causal_offset=0 if causal else None,
                 precision=precision).backward(dout)
    assert [x.grad.dtype for x in (q, k, v)] == [TORCH_DTYPES[dtype]] * 3
    five = lambda x: as_f64(x).reshape(B, K, G, T, H)
    ref = BackwardReference(five(q), as_f64(k), as_f64(v), five(dout), scale=H**-0.5,
                            causal_offset=0 if causal else None)
    check([q.grad, k.grad, v.grad], None, ref, [flashgqa_side(precision, dtype, corrections=S)],
          dtype, f"op autograd vs float64 ({dtype})")


def test_incoming_gradients_of_any_strides(rng):
    # autograd hands the backward whatever dout the graph made: a transposed view (read in
    # place), a view whose last dimension is strided, and a broadcast of stride 0 (out.sum()'s
    # gradient; both copied to contiguous first). The gradients are those of a contiguous dout.
    B, Hq, T, S, H = 1, 4, 6, 9, 16
    inputs = randn(rng, (B, Hq, T, H)), randn(rng, (B, 2, S, H)), randn(rng, (B, 2, S, H))

    def grads(backward):
        q, k, v = (x.clone().requires_grad_() for x in inputs)
        backward(ft.attention(q, k, v, causal=True))
        return [x.grad for x in (q, k, v)]

    dout = randn(rng, (B, Hq, T, H))
    want = grads(lambda out: out.backward(dout))
    views = {"transposed": dout.transpose(1, 2).contiguous().transpose(1, 2),
             "strided H": dout.transpose(-1, -2).contiguous().transpose(-1, -2)}
    for name, view in views.items():
        assert not view.is_contiguous(), name
        got = grads(lambda out: out.backward(view))
        assert all(same_bits(g, w) for g, w in zip(got, want)), name
    got = grads(lambda out: out.sum().backward())
    want = grads(lambda out: out.backward(torch.ones_like(out)))
    assert all(same_bits(g, w) for g, w in zip(got, want)), "broadcast"


def test_inputs_with_a_strided_last_dimension_are_copied(rng):
    q = randn(rng, (1, 4, 16, 5)).transpose(-1, -2)  # [1, 4, 5, 16], H of stride 5
    k = randn(rng, (1, 2, 7, 16))
    assert same_bits(ft.attention(q, k, k), flashgqa.attention(q.contiguous(), k, k))


def test_bad_options_raise_the_library_errors(rng):
    q, k = randn(rng, (1, 4, 5, 16)), randn(rng, (1, 2, 6, 16))
    with pytest.raises(TypeError, match=r"^window: \(3,\), expected None or a pair"):
        ft.attention(q, k, k, window=(3,))
    with pytest.raises(ValueError, match=r"expected each side >= 0, or -1"):
        ft.attention(q, k, k, window=(-2, 0))
    with pytest.raises(ValueError, match=r"^precision: "):
        ft.attention(q, k, k, precision="f64")
    with pytest.raises(ValueError, match=r"cu_seqlens_q.*one given without the other"):
        ft.attention(q, k, k, cu_seqlens_q=cu([5]))


# ---- torch.compile(fullgraph=True): no graph break, eager's bits forward and backward. ----


def run_and_grad(fn, inputs, dout):
    """fn(*inputs) and the gradients of its inputs for the incoming gradient dout."""
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*leaves)
    out.backward(dout)
    return out, [x.grad for x in leaves if x.requires_grad]


def assert_compiled_matches_eager(fn, inputs, dout, **compile_options):
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, **compile_options)
    out, grads = run_and_grad(compiled, inputs, dout)
    want_out, want_grads = run_and_grad(fn, inputs, dout)
    assert same_bits(out, want_out)
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        assert same_bits(g, w), f"gradient of input {i}"


def fa_layout_attention(q, k, v):
    """FlashAttention's [B, T, heads, H] tensors through the SDPA drop-in, top-left causal."""
    out = ft.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                          v.transpose(1, 2), is_causal=True, enable_gqa=True)
    return out.transpose(1, 2)


def test_compile_inductor_forward_and_backward(rng):
    q = randn(rng, (2, 19, 8, 32), "bfloat16")
    k, v = (randn(rng, (2, 27, 2, 32), "bfloat16") for _ in range(2))
    assert_compiled_matches_eager(fa_layout_attention, (q, k, v),
                                  randn(rng, (2, 19, 8, 32), "bfloat16"), backend="inductor")


class GQABlock(torch.nn.Module):
    """Projections, the op in the seed's 5-D layout with a window, and an output projection."""

    def __init__(self, d_model=64, heads=4, kv_heads=2):
        super().__init__()
        self.K, self.G, self.H = kv_heads, heads // kv_heads, d_model // heads
        self.wq = torch.nn.Linear(d_model, d_model, bias=False)
        self.wkv = torch.nn.Linear(d_model, 2 * kv_heads * self.H, bias=False)
        self.wo = torch.nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):  # x [B, T, d_model]
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.K, self.G, self.H).permute(0, 2, 3, 1, 4)
        k, v = self.wkv(x).view(B, T, 2, self.K, self.H).permute(2, 0, 3, 1, 4)
        out = ft.attention(q, k, v, causal=True, window=(5, -1), precision="f32")
        return self.wo(out.permute(0, 3, 1, 2, 4).reshape(B, T, -1))


def test_compile_module_with_dynamic_shapes(rng):
    # aot_eager: dynamo and AOT autograd with the fake kernels, symbolic shapes (two lengths, one
    # graph), run by eager kernels, so the bits must match eager's.
    torch.manual_seed(0)
    block = GQABlock()
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True, backend="aot_eager")
    for T in (13, 30):
        x = randn(rng, (2, T, 64))
        dout = randn(rng, (2, T, 64))
        outs = []
        for fn in (compiled, block):
            block.zero_grad()
            out = fn(x)
            out.backward(dout)
            outs.append((out, [p.grad.clone() for p in block.parameters()]))
        (out, grads), (want, want_grads) = outs
        assert same_bits(out, want), f"T = {T}"
        assert all(same_bits(g, w) for g, w in zip(grads, want_grads)), f"T = {T}"


def test_compile_packed_sequences(rng):
    T, S = int(PACKED["cu_seqlens_q"][-1]), int(PACKED["cu_seqlens_k"][-1])
    q, k, v = randn(rng, (T, 4, 16)), randn(rng, (S, 2, 16)), randn(rng, (S, 2, 16))

    def packed(q, k, v, cu_q, cu_k):
        return ft.attention(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)

    assert_compiled_matches_eager(packed, (q, k, v, PACKED["cu_seqlens_q"],
                                           PACKED["cu_seqlens_k"]),
                                  randn(rng, (T, 4, 16)), backend="aot_eager")


# ---- Without torch. ----


def test_import_without_torch_names_torch():
    # A Python where `import torch` fails: flashgqa itself imports, flashgqa.torch raises an
    # ImportError that names the package.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import flashgqa\n"
            "try:\n"
            "    import flashgqa.torch\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ImportError: flashgqa.torch needs PyTorch (the 'torch' package)" in result.stdout
    assert "pip install torch" in result.stdout
