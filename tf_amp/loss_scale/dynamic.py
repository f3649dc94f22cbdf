"""The dynamic loss scale: grow after a run of finite steps, back off on overflow."""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from tf_amp.loss_scale._base import (
    COUNTER_DTYPE,
    LossScale,
    LossScaleState,
    checked_count,
    checked_scale,
    f32,
    i64,
)


class DynamicLossScale(LossScale):
    """The dynamic loss scale of the NVIDIA recipe, apex ``DynamicLossScaler`` and GradScaler.

    Algorithm (``adjust``), one call per training step::

        if grads_finite:                                  # the step was applied
            consecutive_skips = 0; floor_skips = 0
            good_steps += 1
            if good_steps >= growth_interval:
                good_steps = 0
                scale = max(scale, min(scale * growth_factor, max_scale))  # never lowers it
        else:                                             # the step was skipped
            skipped_steps += 1; consecutive_skips += 1
            good_steps = 0
            if scale <= min_scale: floor_skips += 1       # inf/NaN even with the loss unscaled
            scale = min(scale, max(scale * backoff_factor, min_scale))  # never raises it
            if scale is inf: scale = max_scale

    A scale outside ``[min_scale, max_scale]`` comes only from outside (a restored Keras
    checkpoint, whose scale has no bounds; ``set_loss_scale``): a growth step never lowers it
    and a skip never raises it, and an infinite one (Keras's grows into inf and stays there)
    drops to ``max_scale`` at its first skip.

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
        growth_interval = checked_count(growth_interval, "DynamicLossScale: growth_interval")
        if not (math.isfinite(growth_factor) and growth_factor > 1.0):
            raise ValueError(
                f"DynamicLossScale: growth_factor must be a finite number > 1, got {growth_factor}"
            )
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(
                f"DynamicLossScale: backoff_factor must lie in (0, 1), got {backoff_factor}"
            )
        initial_scale = checked_scale(initial_scale, "DynamicLossScale: initial_scale")
        min_scale = checked_scale(min_scale, "DynamicLossScale: min_scale")
        max_scale = checked_scale(max_scale, "DynamicLossScale: max_scale")
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
        scale = f32(state.scale)
        good = state.good_steps + 1
        grow = good >= self._growth_interval
        grown = tf.maximum(scale, tf.minimum(scale * self._growth_factor, f32(self._max_scale)))
        zero = i64(0)
        return LossScaleState(
            tf.where(grow, grown, scale),
            tf.where(grow, zero, good),
            state.skipped_steps,
            zero,
            zero,
        )

    def after_skip(self, state: LossScaleState) -> LossScaleState:
        scale = f32(state.scale)
        min_scale = f32(self._min_scale)
        floor_skips = state.floor_skips + tf.cast(scale <= min_scale, COUNTER_DTYPE)
        backed_off = tf.minimum(scale, tf.maximum(scale * self._backoff_factor, min_scale))
        return LossScaleState(
            tf.where(tf.math.is_finite(scale), backed_off, f32(self._max_scale)),
            i64(0),
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
