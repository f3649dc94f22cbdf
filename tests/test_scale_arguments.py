"""Bad loss-scale values get an error naming them, in every wrapper family, and leave the
scale as it was.

Each used to pass: ``set_loss_scale(nan)`` (or inf, or 1e39, which is inf in float32) made a
dynamic scale skip every step for good, without the floor warning; 0 and negatives were
taken too. ``1e-50`` was accepted as a static scale that is 0 in float32, a string scale
failed with a comparison error, a fractional ``max_consecutive_skips`` was accepted.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tf_amp
from tf_amp.loss_scale import DynamicLossScale, StaticLossScale, get

BAD_SCALES = [float("nan"), float("inf"), -8.0, 0.0, 1e39, 1e-50, "many", True]


def _wrapper(family: str) -> object:
    inner = {
        "keras": lambda: keras.optimizers.SGD(0.1),
        "tf_keras": lambda: tf_keras.optimizers.SGD(0.1),
        "v1": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    }[family]()
    return tf_amp.LossScaleOptimizer(inner, DynamicLossScale(initial_scale=64.0))


@pytest.mark.parametrize("family", ["keras", "tf_keras", "v1"])
@pytest.mark.parametrize("value", BAD_SCALES)
def test_setting_a_bad_scale_is_refused_and_changes_nothing(family: str, value: object) -> None:
    opt = _wrapper(family)
    with pytest.raises(ValueError, match="the loss scale must be"):
        opt.set_loss_scale(value)
    assert float(opt.loss_scale) == 64.0


@pytest.mark.parametrize("family", ["keras", "tf_keras", "v1"])
def test_a_good_scale_is_set(family: str) -> None:
    opt = _wrapper(family)
    opt.set_loss_scale(np.float32(512.0))
    assert float(opt.loss_scale) == 512.0


@pytest.mark.parametrize("value", [v for v in BAD_SCALES if not isinstance(v, str)])
def test_a_bad_static_scale_is_refused(value: object) -> None:
    with pytest.raises((ValueError, TypeError), match="must be"):
        get(value)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"initial_scale": 1e-45, "min_scale": 1e-46}, "min_scale"),  # 0 in float32
        ({"max_scale": 1e39}, "max_scale"),
        ({"initial_scale": "lots"}, "initial_scale"),
        ({"growth_interval": 2**63}, "growth_interval"),
        ({"growth_interval": "10"}, "growth_interval"),
    ],
)
def test_dynamic_arguments_out_of_float32_or_int64_are_named(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        DynamicLossScale(**kwargs)


def test_a_string_of_a_number_is_one_scale_static_or_dynamic() -> None:
    assert StaticLossScale("1024").initial_scale == 1024.0
    assert DynamicLossScale(initial_scale="1024").initial_scale == 1024.0


@pytest.mark.parametrize("family", ["keras", "tf_keras", "v1"])
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"max_consecutive_skips": 2.5}, "max_consecutive_skips"),
        ({"max_consecutive_skips": "3"}, "max_consecutive_skips"),
        ({"max_consecutive_skips": 0}, "max_consecutive_skips"),
        ({"floor_warning_skips": -1}, "floor_warning_skips"),
    ],
)
def test_skip_counts_are_checked_before_the_inner_optimizer_is_taken(
    family: str, kwargs: dict, named: str
) -> None:
    inner = {
        "keras": lambda: keras.optimizers.SGD(0.1),
        "tf_keras": lambda: tf_keras.optimizers.SGD(0.1),
        "v1": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    }[family]()
    with pytest.raises(ValueError, match=named):
        tf_amp.LossScaleOptimizer(inner, **kwargs)
    tf_amp.LossScaleOptimizer(inner)  # the failed wrapper did not claim it
