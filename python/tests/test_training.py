"""Proof by use (issue #12): a small GQA transformer trained from the same initial weights with
PyTorch's SDPA, under torch.compile(fullgraph=True) with flashgqa's custom op, and under jax.jit with
flashgqa.jax. A shortened run of examples/train_gqa/train.py (the full one: 50 steps at seq 512). The
attention operands are bf16 in all three, so the losses may differ by bf16 roundings: each step's loss
must agree with SDPA's within one bf16 rounding of the loss (relative 2^-8), and training must learn."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_gqa"))
import train  # noqa: E402


def test_three_ways_of_training_agree():
    steps, seq = 8, 96
    sdpa, _ = train.train_torch(steps, seq, train.sdpa_attention)
    compiled, _ = train.train_torch(steps, seq, train.flashgqa_torch_attention, compile_step=True)
    jitted, _ = train.train_jax(steps, seq)
    for name, losses in (("torch.compile + flashgqa", compiled), ("jax.jit + flashgqa.jax", jitted)):
        for step, (a, b) in enumerate(zip(sdpa, losses)):
            assert abs(a - b) <= 2.0**-8 * abs(a), f"{name}, step {step}: loss {b} vs SDPA's {a}"
    assert sdpa[-1] < sdpa[0] - 0.1, f"the model did not learn: {sdpa}"
