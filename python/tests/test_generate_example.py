"""examples/generate runs end to end with a float32, bfloat16, float16 and int8 paged cache and reports
tokens/s; the narrower caches (rounded, or quantized by the call as tokens are appended) change the
greedy tokens little on this small random model."""
import functools
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "generate" / "generate.py"


@functools.lru_cache(maxsize=None)  # the float32 run serves every case
def run(kv_dtype):
    out = subprocess.run([sys.executable, str(EXAMPLE), "--batch", "3", "--new-tokens", "12", "--kv-dtype", kv_dtype],
                         check=True, capture_output=True, text=True, timeout=300).stdout
    assert re.search(r"decode: 3 x 11 tokens in [0-9.]+ ms = [0-9.]+ tokens/s", out), out
    return re.search(r"first tokens: (.*)", out).group(1)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float16", "int8"])
def test_generate_agrees_with_a_float32_cache(kv_dtype):
    f32, narrow = run("float32"), run(kv_dtype)
    # The same prompts through the same weights: the first generated token of each sequence (after
    # the prefill) agrees; later ones may drift, as rounding may flip a near-tie.
    firsts = lambda s: re.findall(r"\[(\d+),", s)  # noqa: E731
    assert len(firsts(f32)) == 3, f32
    assert firsts(f32) == firsts(narrow), (f32, narrow)
