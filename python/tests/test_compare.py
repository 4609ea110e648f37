"""python -m flashgqa.compare: every installed baseline is timed and reported (no speed is asserted:
speed targets live in the benchmarks); missing baselines are named, not silently dropped."""
import subprocess
import sys

import pytest

from flashgqa import compare


def test_compare_times_every_baseline_and_writes_a_chart(tmp_path):
    chart = tmp_path / "compare.svg"
    out = subprocess.run([sys.executable, "-m", "flashgqa.compare", "--lengths", "64",
                          "--repeats", "1", "--chart", str(chart)],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    assert "bf16 peak on" in out and "not installed" not in out, out
    for impl in ("flashgqa", "torch SDPA", "jax XLA"):
        for case in ("T=S=64 full forward |", "T=S=64 causal forward+backward |"):
            assert f"| {case} {impl} |" in out, f"no row for {impl}, {case}\n{out}"
    assert chart.read_text().startswith("<svg") and "flashgqa:" in chart.read_text()


def test_missing_baselines_are_named(monkeypatch, capsys):
    monkeypatch.setitem(compare.BASELINES, "jax XLA", ("a_module_that_is_not_installed", None))
    rows, _, missing = compare.run([32], 1, 1)
    assert missing == ["jax XLA"]
    assert "not installed, skipped: jax XLA" in capsys.readouterr().out
    assert {name for _, name, *_ in rows} == {"flashgqa", "torch SDPA"}


def test_flop_count_follows_the_mask():
    assert compare._flops(4, 4, False, False) == 4.0 * compare.K * compare.G * compare.H * 16
    assert compare._flops(4, 4, True, False) == 4.0 * compare.K * compare.G * compare.H * 10
    assert compare._flops(4, 4, True, True) == 3.5 * compare._flops(4, 4, True, False)


def test_bad_arguments_exit_with_a_message():
    with pytest.raises(SystemExit):
        compare.main(["--lengths", "a,b"])
