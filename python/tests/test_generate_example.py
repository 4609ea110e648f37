"""examples/generate runs end to end with a float32 and an int8 paged cache and reports tokens/s; the
int8 cache (quantized by the call as tokens are appended) changes the greedy tokens little on this
small random model."""
import pathlib
import re
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "generate" / "generate.py"


def run(kv_dtype):
    out = subprocess.run([sys.executable, str(EXAMPLE), "--batch", "3", "--new-tokens", "12", "--kv-dtype", kv_dtype],
                         check=True, capture_output=True, text=True, timeout=300).stdout
    assert re.search(r"decode: 3 x 11 tokens in [0-9.]+ ms = [0-9.]+ tokens/s", out), out
    return re.search(r"first tokens: (.*)", out).group(1)


def test_generate_float32_and_int8():
    f32, i8 = run("float32"), run("int8")
    # The same prompts through the same weights: the first generated token of each sequence (after
    # the prefill) agrees; later ones may drift, as quantization may flip a near-tie.
    firsts = lambda s: re.findall(r"\[(\d+),", s)  # noqa: E731
    assert firsts(f32) == firsts(i8), (f32, i8)
