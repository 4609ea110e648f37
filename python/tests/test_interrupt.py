"""Ctrl-C during a long call raises KeyboardInterrupt promptly (the library polls between tasks), and
leaves the process usable; a call that is not interrupted is unaffected."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import flashgqa

# A forward of ~2e13 FLOP: tens of seconds on 2 cores, so SIGINT lands mid-call.
# A process started in the background by a non-interactive shell inherits SIGINT ignored, and Python
# then installs no KeyboardInterrupt handler: the child and the in-process test put Python's own back.
CHILD = textwrap.dedent("""
    import signal, sys, time
    import numpy as np, ml_dtypes, flashgqa
    signal.signal(signal.SIGINT, signal.default_int_handler)
    B, K, G, T, H = 1, 8, 4, 32768, 128
    q = np.ones((B, K, G, T, H), ml_dtypes.bfloat16)
    k = np.ones((B, K, T, H), ml_dtypes.bfloat16)
    print("ready", flush=True)
    t0 = time.monotonic()
    try:
        flashgqa.{call}
        print("completed", flush=True)
    except KeyboardInterrupt:
        print(f"interrupted after {{time.monotonic() - t0:.2f}} s", flush=True)
        out = flashgqa.attention(q[:, :, :, :8], k[:, :, :8], k[:, :, :8])  # still usable
        print("usable", out.shape, flush=True)
""")


def run_and_interrupt(call):
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(call=call)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # into the call
    start = time.monotonic()
    child.send_signal(signal.SIGINT)
    try:
        out, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        raise
    return out, err, time.monotonic() - start


def test_ctrl_c_interrupts_a_long_forward():
    out, err, waited = run_and_interrupt("attention(q, k, k, threads=2)")
    assert "interrupted after" in out, (out, err)
    assert "usable (1, 8, 4, 8, 128)" in out, (out, err)
    assert "completed" not in out
    # The call itself would take tens of seconds; stopping takes about one task.
    assert waited < 10, waited


def test_ctrl_c_interrupts_the_naive_rung():
    out, err, _ = run_and_interrupt("attention(q[:, :, :, :8192], k[:, :, :8192], k[:, :, :8192], "
                                    "algo='naive', threads=2)")
    assert "interrupted after" in out, (out, err)


@pytest.fixture
def python_sigint_handler():
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_call_without_ctrl_c_is_unaffected_and_python_keeps_its_handler(python_sigint_handler):
    handler = signal.getsignal(signal.SIGINT)
    q = np.random.default_rng(0).standard_normal((1, 2, 2, 33, 64), dtype=np.float32)
    k = np.random.default_rng(1).standard_normal((1, 2, 40, 64), dtype=np.float32)
    a = flashgqa.attention(q, k, k)
    b = flashgqa.attention(q, k, k)
    assert np.array_equal(a, b)
    assert signal.getsignal(signal.SIGINT) is handler
    # Python's own handler is back in place: a SIGINT after the call still raises here.
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("SIGINT after a call did not reach Python")
