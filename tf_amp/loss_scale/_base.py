"""The loss-scale state and the policy interface every policy implements."""

from __future__ import annotations

import abc
import math
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

COUNTER_DTYPE = tf.int64


class LossScaleState(NamedTuple):
    """The whole mutable state of loss scaling; the wrappers keep one variable per field.

    Fields:
      scale: current loss scale (float32 scalar).
      good_steps: consecutive finite steps since the scale last changed (int64).
      skipped_steps: total number of steps skipped because a gradient was not finite (int64).
      consecutive_skips: non-finite steps in a row, reset by a finite step (int64).
      floor_skips: non-finite steps in a row taken while the scale was already at its floor;
        a non-zero value means the non-finite values do not come from scaling the loss up:
        values beyond float16's range even unscaled, or an inf/NaN that float32 would
        produce too (int64).
    """

    scale: Any
    good_steps: Any
    skipped_steps: Any
    consecutive_skips: Any
    floor_skips: Any


def checked_scale(value: Any, what: str) -> float:
    """``value`` as a loss scale: a real number whose float32 value is finite and > 0.

    The checks are float32's, the variable's dtype: 1e39 is inf there and 1e-46 is 0, and
    either makes every step skip (a scale of 0 turns a finite gradient into nan). ``what``
    names the argument in the error. Strings of numbers are read as numbers, as ``float`` reads
    them, so a static and a dynamic scale take the same spellings.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    as_f32 = float(np.float32(number)) if abs(number) < 1e39 else math.inf
    if not (math.isfinite(as_f32) and as_f32 > 0):
        raise ValueError(
            f"{what} must be a finite number > 0 in float32 (about 1.2e-38 to 3.4e38), "
            f"got {value!r}"
        )
    return number


def checked_count(value: Any, what: str, minimum: int = 1) -> int:
    """``value`` as a step count: an integer >= ``minimum`` that fits the int64 counters."""
    whole_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    whole_float = isinstance(value, (float, np.floating)) and float(value).is_integer()
    if not (whole_int or whole_float):
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    if not minimum <= value < 2**62:
        raise ValueError(f"{what} must be an integer >= {minimum} (below 2**62), got {value!r}")
    return int(value)


def f32(value: Any) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(value), tf.float32)


def i64(value: Any) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(value), COUNTER_DTYPE)


class LossScale(abc.ABC):
    """A loss-scale policy: ``initial_state()``, ``scale(loss, state)`` and the transition,
    ``adjust(state, grads_finite)`` = ``after_finite(state)`` or ``after_skip(state)``.

    Subclasses are immutable value objects; equality and ``get_config`` describe them fully.
    """

    @property
    @abc.abstractmethod
    def dynamic(self) -> bool:
        """Whether the scale changes during training."""

    @property
    @abc.abstractmethod
    def initial_scale(self) -> float:
        """The scale at step 0."""

    @abc.abstractmethod
    def after_finite(self, state: LossScaleState) -> LossScaleState:
        """The state after a step whose gradients were all finite (the step was applied).

        Fields that do not change are returned as the very objects passed in, so a caller
        holding variables can skip writing them.
        """

    @abc.abstractmethod
    def after_skip(self, state: LossScaleState) -> LossScaleState:
        """The state after a step with a non-finite gradient (the step was skipped)."""

    def adjust(self, state: LossScaleState, grads_finite: Any) -> LossScaleState:
        """Returns the state after one step whose gradients were finite or not.

        Built from TF ops only (``tf.where``, no Python branching on tensor values), so it works
        eagerly, inside ``tf.function`` and inside a ``tf.cond`` branch, with no host sync. The
        optimizers instead call ``after_finite`` / ``after_skip`` inside the two branches of
        their apply-or-skip cond, which is the same function split in two (fewer ops per step).
        """
        finite = tf.convert_to_tensor(grads_finite, tf.bool)
        state = LossScaleState(f32(state.scale), *(i64(x) for x in state[1:]))
        applied, skipped = self.after_finite(state), self.after_skip(state)
        return LossScaleState(
            *(
                tf.where(finite, tf.cast(a, old.dtype), tf.cast(b, old.dtype))
                for a, b, old in zip(applied, skipped, state, strict=True)
            )
        )

    @abc.abstractmethod
    def get_config(self) -> dict[str, Any]:
        """Constructor arguments; ``from_config(get_config())`` gives an equal policy."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LossScale:
        return cls(**config)

    def initial_state(self) -> LossScaleState:
        zero = i64(0)
        return LossScaleState(f32(self.initial_scale), zero, zero, zero, zero)

    def scale(self, value: Any, state: LossScaleState) -> Any:
        """``value * scale``, computed in float32 when ``value`` is a 16-bit float.

        A float16 loss times 2**24 would overflow in float16 before any gradient exists; in
        float32 it cannot, and the backward Cast brings the gradient back to the model dtype.
        """
        value = tf.convert_to_tensor(value)
        if value.dtype in (tf.float16, tf.bfloat16):
            value = tf.cast(value, tf.float32)
        return value * tf.cast(state.scale, value.dtype)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"
