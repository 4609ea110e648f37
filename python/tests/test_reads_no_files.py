"""A call of flashgqa.attention opens no file: no tune cache under ~/.cache, nothing under /proc.

The calls run in a subprocess traced with `strace -f -e trace=open,openat` (every thread). Importing
flashgqa, numpy and ml_dtypes opens many files, so the subprocess imports first and then opens a path
that does not exist as a begin marker; only the opens between that marker and an end marker are the
calls'. scripts/install-deps.sh installs strace: without it this test fails rather than skips.
"""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

BEGIN = "/flashgqa-python-reads-no-files-begin"
END = "/flashgqa-python-reads-no-files-end"

# The first call of each kind is the one that would load a cache (once per process): trace them all.
CALLS = textwrap.dedent(f"""
    import os
    import ml_dtypes
    import numpy as np
    import flashgqa

    def mark(path):
        try:
            os.close(os.open(path, os.O_RDONLY))
        except OSError:
            pass

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 4, 300, 64)).astype(np.float32)   # [B,K,G,T,H]
    k = rng.standard_normal((1, 2, 700, 64)).astype(np.float32)      # [B,K,S,H]
    qb, kb = q.astype(ml_dtypes.bfloat16), k.astype(ml_dtypes.bfloat16)
    mark({BEGIN!r})
    flashgqa.attention(q, k, k)                                      # flash, automatic blocks
    flashgqa.attention(qb, kb, kb, causal=True)
    flashgqa.attention(q, k, k, precision="f32", return_lse=True)
    flashgqa.attention(q[:, :, :, :1], k, k)                         # decode
    flashgqa.attention(q, k, k, algo="kernel1")
    flashgqa.linear_attention(q, k, k)
    mark({END!r})
""")

OPEN_PATH = re.compile(r'\bopen(?:at)?\((?:[^,"]*, )?"((?:[^"\\]|\\.)*)"')


def traced_opens(tmp_path, env):
    """The paths opened (or tried) between the markers, in any thread of the subprocess."""
    strace = shutil.which("strace")
    assert strace, "strace not found: scripts/install-deps.sh installs it (apt-get install strace)"
    log = tmp_path / "strace.log"
    result = subprocess.run(
        [strace, "-f", "-qq", "-e", "trace=open,openat", "-o", str(log), sys.executable, "-c", CALLS],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    paths = [m.group(1) for line in log.read_text().splitlines() if (m := OPEN_PATH.search(line))]
    assert BEGIN in paths and END in paths, "markers not traced: " + log.read_text()[-2000:]
    return paths[paths.index(BEGIN) + 1:paths.index(END)]


def under(path, folder):
    folder = os.path.normpath(folder)
    return os.path.normpath(path) == folder or os.path.normpath(path).startswith(folder + os.sep)


@pytest.mark.parametrize("cache_env", ["unset", "set"])
def test_attention_opens_no_cache_and_nothing_under_proc(tmp_path, cache_env):
    env = dict(os.environ)
    forbidden = [os.path.expanduser("~/.cache"), "/proc"]
    env.pop("FLASHGQA_TUNE_CACHE", None)
    env.pop("XDG_CACHE_HOME", None)
    if cache_env == "set":  # the tools' variables name a cache: the library still reads none
        tune = tmp_path / "tune.tsv"
        tune.write_text("# flashgqa tune cache v1\n")
        env["FLASHGQA_TUNE_CACHE"] = str(tune)
        env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
        forbidden += [str(tune), str(tmp_path / "xdg")]
    opened = traced_opens(tmp_path, env)
    bad = [p for p in opened if any(under(p, f) for f in forbidden)]
    assert not bad, f"flashgqa calls opened {bad} (all opens during the calls: {opened})"
