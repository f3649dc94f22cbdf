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

import abc
import math
from typing import Any, NamedTuple

import tensorflow as tf

_COUNTER_DTYPE = tf.int64


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


def _f32(value: Any) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(value), tf.float32)


def _i64(value: Any) -> tf.Tensor:
    return tf.cast(tf.convert_to_tensor(value), _COUNTER_DTYPE)


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
        state = LossScaleState(_f32(state.scale), *(_i64(x) for x in state[1:]))
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
        zero = _i64(0)
        return LossScaleState(_f32(self.initial_scale), zero, zero, zero, zero)

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


class StaticLossScale(LossScale):
    """A fixed loss scale (apex ``static_loss_scale``).

    The scale never changes, but a step with non-finite gradients is still skipped and counted:
    applying ``inf`` or ``nan`` would destroy the weights, and a static scale that is too large
    shows up as a growing ``skipped_steps`` count instead of a silently diverged model.
    """

    def __init__(self, scale: float) -> None:
        scale = float(scale)
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"StaticLossScale: scale must be a finite number > 0, got {scale}")
        self._scale = scale

    @property
    def dynamic(self) -> bool:
        return False

    @property
    def initial_scale(self) -> float:
        return self._scale

    def after_finite(self, state: LossScaleState) -> LossScaleState:
        zero = _i64(0)
        return LossScaleState(state.scale, state.good_steps + 1, state.skipped_steps, zero, zero)

    def after_skip(self, state: LossScaleState) -> LossScaleState:
        return LossScaleState(
            state.scale,
            _i64(0),
            state.skipped_steps + 1,
            state.consecutive_skips + 1,
            state.floor_skips,
        )

    def get_config(self) -> dict[str, Any]:
        return {"scale": self._scale}


class DynamicLossScale(LossScale):
    """The dynamic loss scale of the NVIDIA recipe, apex ``DynamicLossScaler`` and GradScaler.

    Algorithm (``adjust``), one call per training step::

        if grads_finite:                                  # the step was applied
            consecutive_skips = 0; floor_skips = 0
            good_steps += 1
            if good_steps >= growth_interval:
                good_steps = 0
                scale = min(scale * growth_factor, max_scale)    # never inf: max_scale is finite
        else:                                             # the step was skipped
            skipped_steps += 1; consecutive_skips += 1
            good_steps = 0
            if scale <= min_scale: floor_skips += 1       # inf/NaN even with the loss unscaled
            scale = max(scale * backoff_factor, min_scale)

    Defaults: ``initial_scale=2**15, growth_interval=2000, growth_factor=2, backoff_factor=0.5,
    min_scale=1, max_scale=2**24``. ``min_scale <= initial_scale <= max_scale`` is required.
    """

    def __init__(
        self,
        initial_scale: float = 2.0**15,
        growth_interval: int = 2000,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
    ) -> None:
        if int(growth_interval) != growth_interval or growth_interval < 1:
            raise ValueError(
                f"DynamicLossScale: growth_interval must be an integer >= 1, got {growth_interval}"
            )
        if not (math.isfinite(growth_factor) and growth_factor > 1.0):
            raise ValueError(
                f"DynamicLossScale: growth_factor must be a finite number > 1, got {growth_factor}"
            )
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(
                f"DynamicLossScale: backoff_factor must lie in (0, 1), got {backoff_factor}"
            )
        f32_max = float(tf.float32.max)
        for name, value in (("min_scale", min_scale), ("max_scale", max_scale)):
            if not (math.isfinite(value) and 0.0 < value <= f32_max):
                raise ValueError(
                    f"DynamicLossScale: {name} must be a finite float32 number > 0, got {value}"
                )
        if not min_scale <= initial_scale <= max_scale:
            raise ValueError(
                "DynamicLossScale: need min_scale <= initial_scale <= max_scale, got "
                f"{min_scale} <= {initial_scale} <= {max_scale}"
            )
        self._initial_scale = float(initial_scale)
        self._growth_interval = int(growth_interval)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._min_scale = float(min_scale)
        self._max_scale = float(max_scale)

    @property
    def dynamic(self) -> bool:
        return True

    @property
    def initial_scale(self) -> float:
        return self._initial_scale

    @property
    def growth_interval(self) -> int:
        return self._growth_interval

    @property
    def growth_factor(self) -> float:
        return self._growth_factor

    @property
    def backoff_factor(self) -> float:
        return self._backoff_factor

    @property
    def min_scale(self) -> float:
        return self._min_scale

    @property
    def max_scale(self) -> float:
        return self._max_scale

    def after_finite(self, state: LossScaleState) -> LossScaleState:
        scale = _f32(state.scale)
        good = state.good_steps + 1
        grow = good >= self._growth_interval
        grown = tf.minimum(scale * self._growth_factor, _f32(self._max_scale))
        zero = _i64(0)
        return LossScaleState(
            tf.where(grow, grown, scale),
            tf.where(grow, zero, good),
            state.skipped_steps,
            zero,
            zero,
        )

    def after_skip(self, state: LossScaleState) -> LossScaleState:
        scale = _f32(state.scale)
        min_scale = _f32(self._min_scale)
        floor_skips = state.floor_skips + tf.cast(scale <= min_scale, _COUNTER_DTYPE)
        return LossScaleState(
            tf.maximum(scale * self._backoff_factor, min_scale),
            _i64(0),
            state.skipped_steps + 1,
            state.consecutive_skips + 1,
            floor_skips,
        )

    def get_config(self) -> dict[str, Any]:
        return {
            "initial_scale": self._initial_scale,
            "growth_interval": self._growth_interval,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "min_scale": self._min_scale,
            "max_scale": self._max_scale,
        }


def get(loss_scale: Any) -> LossScale:
    """Turns the ``loss_scale`` argument users pass into a policy, or says what to pass.

    Accepts ``"dynamic"``, a positive number (static scale), or a ``LossScale`` instance.
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
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)):
        raise TypeError(
            f'loss_scale must be "dynamic", a positive number or a tf_amp.LossScale, got '
            f"{type(loss_scale).__name__}"
        )
    return StaticLossScale(loss_scale)


def serialize(policy: LossScale) -> dict[str, Any]:
    return {"class_name": type(policy).__name__, "config": policy.get_config()}


def deserialize(config: dict[str, Any]) -> LossScale:
    classes = {"StaticLossScale": StaticLossScale, "DynamicLossScale": DynamicLossScale}
    if config.get("class_name") not in classes:
        raise ValueError(f"unknown loss scale class in config: {config.get('class_name')!r}")
    return classes[config["class_name"]].from_config(dict(config["config"]))
