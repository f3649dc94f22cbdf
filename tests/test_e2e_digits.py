"""The main job (examples/train_digits.py) end to end on the real dataset, in a subprocess.

The first test runs it as the README does (the machine's own target: no pinned target, oneDNN
as TensorFlow defaults it), shortened to 4 epochs; the second as on a CPU where no reduced
precision is fast (oneDNN off), where the job keeps float32 and says so. The parity test pins
float16 with loss scaling on the job's original 8x8 model, which keeps three seeds within the
test budget on any CPU; the full 3-seed figure comes from
``python examples/train_digits.py --parity``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

REPO = Path(__file__).resolve().parents[1]
# TensorFlow before 2.21 has slow float16 convolution gradients on a CPU (oneDNN off, Eigen):
# 8x8x32 maps, batch 32, Conv2DBackpropFilter / Conv2DBackpropInput took ~61 ms each in 2.19.1
# and 2.20.0 against 2.7 ms in 2.21.0 (float32: 1-4 ms in all three), so the forced-float16
# parity run takes ~11 s an epoch instead of ~1.3 s and cannot fit its time budget there.
_OLD_TF_SLOW_HALF_CONV = tuple(int(p) for p in tf.__version__.split(".")[:2]) < (2, 21)


def _run_main_job(tmp_path: Path, env_changes: dict[str, str | None], *flags: str) -> str:
    """The README's first command, shortened; returns what it printed."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    for name, value in env_changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_digits.py"), f"--logdir={tmp_path}",
         "--noprogress", *flags],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _check_report(out: str, tmp_path: Path) -> str:
    """Everything the job promises to print, for whichever target it chose; returns that."""
    target, reason = out.split("target: ")[1].split("\n")[0].split(" ", 1)
    assert target in ("float16", "bfloat16", "float32") and len(reason) > 20, reason
    second = "mixed precision" if target != "float32" else "tf_amp, float32"
    fp32 = float(out.split("float32         test accuracy:")[1].split()[0])
    amp = float(out.split(f"{second} test accuracy:")[1].split()[0])
    assert fp32 > 0.9 and amp > 0.9
    assert abs(amp - fp32) <= 0.03  # one seed, 4 epochs: 3 points (parity mode: 1 point)
    assert "x float32" in out  # the step-time ratio
    graphs = tmp_path / "seed0" / "mixed" / "graphs"
    if target == "float32":
        # No fast reduced precision: the job says so, converts nothing and points at no graphs
        # (none are written), and says how to force a target.
        assert "rewrite: none" in out and "TF_AMP_TARGET_DTYPE=bfloat16" in out
        assert "reduced-precision ops" not in out
        assert str(graphs) not in out and not graphs.exists()
    else:
        reduced = int(out.split("reduced-precision ops in the executed train step:")[1].split()[0])
        assert "rewrite: Converted" in out and reduced > 0
        assert str(graphs) in out and list(graphs.glob("graphdef_AutoMixedPrecision_*.pb"))
    if target == "float16":
        assert "loss scale:" in out and "skipped steps:" in out
    else:
        assert f"loss scale: off ({target} needs none)" in out
    return target


def test_main_job_prints_everything_and_mixed_precision_matches_float32(tmp_path: Path) -> None:
    """As the README runs it: the machine decides the target (no pinned target, oneDNN as
    TensorFlow defaults it). 4 epochs, and half the width: a quarter of the convolution work,
    so that a slow 2-core CPU (an AVX2 EPYC takes ~17 s an epoch at full width) fits."""
    out = _run_main_job(tmp_path, {"TF_AMP_TARGET_DTYPE": None, "TF_ENABLE_ONEDNN_OPTS": None},
                        "--epochs=4", "--width=32")
    target = _check_report(out, tmp_path)
    if target == "float32":
        assert "AMX-BF16" in out.split("target: ")[1].split("\n")[0]


def test_main_job_where_no_reduced_precision_is_fast(tmp_path: Path) -> None:
    """A CPU whose reduced-precision kernels are all slow (as with oneDNN off, on any CPU):
    the job keeps float32, says why, and still reports both runs. Every machine takes this
    branch here, whatever its own target; the 8x8 model keeps it short."""
    out = _run_main_job(
        tmp_path,
        {"TF_AMP_TARGET_DTYPE": None, "TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": ""},
        "--epochs=4", "--image_size=8", "--width=32", "--batch_size=32",
    )
    assert _check_report(out, tmp_path) == "float32"


@pytest.mark.skipif(
    _OLD_TF_SLOW_HALF_CONV,
    reason=f"TensorFlow {tf.__version__}'s float16 CPU convolution gradients are ~20x slower "
    "than 2.21's: the forced-float16 3-seed run exceeds its budget (it runs on the newest pair)",
)
def test_convergence_parity_over_three_seeds(tmp_path: Path) -> None:
    """The issue's goal: mixed-precision test accuracy within 1 point of float32, over 3 seeds
    (mean), printed with the spread. Shortened to 12 epochs to fit the suite's budget."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    env["TF_AMP_TARGET_DTYPE"] = "float16"  # loss scaling on, whatever the machine
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_digits.py"), "--parity",
         "--epochs=12", "--image_size=8", "--width=32", "--batch_size=32", f"--logdir={tmp_path}",
         "--noprogress"],
        env=env, capture_output=True, text=True, timeout=480,
    )
    out = proc.stdout
    gap = float(out.split("mean difference:")[1].split()[0])
    fp32_mean = float(out.split("float32 mean")[1].split()[0])
    amp_mean = float(out.split("mixed   mean")[1].split()[0])
    assert "spread (std)" in out
    assert fp32_mean > 0.9 and amp_mean > 0.9
    assert abs(gap) <= 1.0, out[-2000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
