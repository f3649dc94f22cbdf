"""Real-model corpus (bench/corpus.py): a keras.applications ResNet-50 train step, rewritten by
tf_amp's default, against TensorFlow's real GPU pass and against Keras's own mixed_float16.

Only ResNet-50 is affordable in the suite (~1.5 min on 2 cores); MobileNetV2, EfficientNetB0
and DenseNet121 run in ``python bench/corpus.py`` (figures in the README). MobileNetV2's graph
is also in the differential tests (tests/test_differential_gpu.py).
"""

from __future__ import annotations

import math
import os
import sys

import pytest

from tests import _gpu_oracle
from tests.differential_helpers import check_default

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))

import corpus  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def resnet50() -> corpus.Row:
    return corpus.measure("resnet50", steps=3, compare=not _gpu_oracle.should_skip())


def test_resnet50_rewrite_matches_tensorflows_gpu_pass(resnet50: corpus.Row) -> None:
    if _gpu_oracle.should_skip():
        pytest.skip(_gpu_oracle.missing_reason())
    row = resnet50
    assert row.rewrite is not None and row.rewrite.report.type_attrs_converted > 0
    check_default("corpus resnet50", row.graph, row.rewrite, row.comparison)


def test_resnet50_trains_as_close_to_float32_as_keras_mixed_float16(resnet50: corpus.Row) -> None:
    row = resnet50
    for losses in (row.losses_f32, row.losses_amp, row.losses_keras):
        assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    amp = corpus.mean_abs_delta(row.losses_amp, row.losses_f32)
    keras_mp = corpus.mean_abs_delta(row.losses_keras, row.losses_f32)
    print(f"\nresnet50 first-step |d|: tf_amp {amp:.3e}, keras mixed_float16 {keras_mp:.3e}; "
          f"skips tf_amp {row.skips_amp}, keras {row.skips_keras}")
    assert amp > 0  # half precision really ran
    # Measured here: 8.2e-2 against Keras's 9.1e-2. The 25% margin is for other CPUs'
    # float16 kernels, whose rounding differs; it does not hide a systematic loss of accuracy.
    assert amp <= 1.25 * keras_mp
    assert row.skips_amp <= row.skips_keras
