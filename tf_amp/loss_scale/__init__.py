"""Loss-scale policies: a pure state machine, separate from any optimizer plumbing.

Why a separate module: the arithmetic that decides the next loss scale is small but easy to get
subtly wrong (growth to ``inf``, a floor that is never reached, a counter that is not reset).
Keeping it a pure function of ``(state, grads_finite) -> state`` lets us check it exhaustively
against a reference model (``tests/test_loss_scale.py``) without building a model, and lets the
Keras and ``tf.compat.v1`` wrappers share one implementation. The wrappers own the variables; a
policy owns no state at all.

Typical use (what the optimizer wrappers do every step)::

    policy = DynamicLossScale()
    state = policy.initial_state()
    grads, finite = unscale_and_check_finite(tape.gradient(loss * state.scale, vs), state.scale)
    state = policy.adjust(state, finite)   # works eagerly and inside tf.function / tf.cond
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from tf_amp.loss_scale._base import LossScale, LossScaleState
from tf_amp.loss_scale.dynamic import DynamicLossScale
from tf_amp.loss_scale.static import StaticLossScale

__all__ = [
    "DynamicLossScale",
    "LossScale",
    "LossScaleState",
    "StaticLossScale",
    "deserialize",
    "get",
    "serialize",
]


def get(loss_scale: Any) -> LossScale:
    """Turns the ``loss_scale`` argument users pass into a policy, or says what to pass.

    Accepts ``"dynamic"``, a positive number (static scale: a Python or NumPy scalar, or a
    0-d array or eager tensor), or a ``LossScale`` instance.
    """
    if isinstance(loss_scale, LossScale):
        return loss_scale
    if isinstance(loss_scale, str):
        if loss_scale.lower() == "dynamic":
            return DynamicLossScale()
        raise ValueError(
            f'loss_scale={loss_scale!r} is not understood; pass "dynamic", a positive number '
            "for a static scale, or a tf_amp.DynamicLossScale / StaticLossScale instance"
        )
    number = _as_number(loss_scale)
    if number is None:
        raise TypeError(
            f'loss_scale must be "dynamic", a positive number or a tf_amp.LossScale, got '
            f"{type(loss_scale).__name__}"
        )
    return StaticLossScale(number)


def _as_number(value: Any) -> float | None:
    """``value`` as a Python float when it is one number: a Python or NumPy scalar, or a
    0-d array or eager tensor (``np.float32(128)``, ``tf.constant(128.0)``: what Keras's own
    wrapper accepts); None for anything else, booleans included."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "shape", None) == () and _is_real(getattr(value, "dtype", None)):
        try:
            return float(value)  # raises for a symbolic (graph) tensor
        except (TypeError, ValueError):
            return None
    return None


def _is_real(dtype: Any) -> bool:
    """An integer or floating dtype, NumPy's or TensorFlow's (bfloat16 included, whose NumPy
    kind is "V")."""
    if hasattr(dtype, "is_floating"):  # a tf.DType
        return bool(dtype.is_floating or dtype.is_integer)
    try:
        return np.dtype(dtype).kind in "iuf"
    except TypeError:
        return False


def serialize(policy: LossScale) -> dict[str, Any]:
    return {"class_name": type(policy).__name__, "config": policy.get_config()}


def deserialize(config: dict[str, Any]) -> LossScale:
    classes = {"StaticLossScale": StaticLossScale, "DynamicLossScale": DynamicLossScale}
    if config.get("class_name") not in classes:
        raise ValueError(f"unknown loss scale class in config: {config.get('class_name')!r}")
    return classes[config["class_name"]].from_config(dict(config["config"]))
