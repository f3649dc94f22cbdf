"""The loss-scale floor messages: printed when the scale falls to its floor, and again when
steps keep being skipped there, in words true whether the gradients overflow float16 even
unscaled or the step produces NaN.

Issue 15: a ResNet-50 fell from 2**15 to 1.0 in 15 skipped steps with no message at all: the
only message printed after ``floor_warning_skips`` (2) more skips *at* the floor, so a run that
reached the floor and then had finite steps (or was stopped) never heard of it.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tf_amp.loss_scale import DynamicLossScale


def _run(grad: float, steps: int, capfd: pytest.CaptureFixture, **kwargs: object) -> str:
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), **kwargs)
    step = tf.function(lambda g: opt.apply([g], [w]))
    for _ in range(steps):
        step(tf.constant([grad]))
    assert float(w.numpy()[0]) == 1.0  # every step skipped
    return capfd.readouterr().err


def test_falling_to_the_floor_with_default_scale_says_so_at_once(capfd):
    # 2**15 halves 15 times to 1.0: the 15th skip reaches the floor; nothing was skipped at it
    err = _run(np.inf, 15, capfd)
    assert err.count("fell to its floor") == 1, err
    assert "15 steps in a row" in err
    assert "at its floor" not in err  # the stuck-at-the-floor message waits for skips there


def test_stuck_at_the_floor_message_is_true_for_overflow(capfd):
    # an inf gradient at scale 1 is what a value beyond float16's range (65504) gives even
    # unscaled: the message must not call it "a NaN in the model"
    err = _run(np.inf, 4, capfd, loss_scale=DynamicLossScale(initial_scale=2.0))
    assert err.count("fell to its floor") == 1 and err.count("at its floor") == 1, err
    assert "not a float16 overflow" not in err
    assert "65504" in err and "overflow" in err and "NaN" in err


def test_no_floor_message_while_the_scale_stays_above_it(capfd):
    err = _run(np.inf, 2, capfd, loss_scale=DynamicLossScale(initial_scale=8.0))  # 8 -> 2
    assert "floor" not in err, err
