"""The loss-scale state and the policy interface every policy implements."""

from __future__ import annotations

import abc
from typing import Any, NamedTuple

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
