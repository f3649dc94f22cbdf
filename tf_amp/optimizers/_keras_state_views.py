"""The Keras wrapper's loss-scale state as users read and set it (Keras 3 / tf.keras names).

A mixin of :class:`tf_amp.optimizers.keras.KerasLossScaleOptimizer`, which owns the state
variables (``_state_vars``: one per ``LossScaleState`` field) and the policy (``_policy``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_amp.loss_scale import LossScale, LossScaleState


class LossScaleViews:
    """Read (and set) the scale, its counters and its policy."""

    _state_vars: list[Any]
    _policy: LossScale
    enabled: bool

    def _state(self) -> LossScaleState:
        return LossScaleState(*(v.value for v in self._state_vars))

    @property
    def loss_scale_policy(self) -> LossScale:
        """The ``tf_amp.LossScale`` (static or dynamic) that moves the scale."""
        return self._policy

    @property
    def dynamic(self) -> bool:
        return self._policy.dynamic

    @property
    def initial_scale(self) -> float:
        return self._policy.initial_scale

    @property
    def dynamic_growth_steps(self) -> int | None:
        return getattr(self._policy, "growth_interval", None)

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current scale (float32 scalar); 1 when disabled. Assign to set it (apex-style)."""
        if not self.enabled:
            return tf.constant(1.0)
        return tf.convert_to_tensor(self._state_vars[0].value)

    @loss_scale.setter
    def loss_scale(self, value: float) -> None:
        self.set_loss_scale(value)

    def set_loss_scale(self, value: float) -> None:
        """Sets the current scale, e.g. to change a static scale mid-training."""
        self._state_vars[0].assign(float(value))

    @property
    def dynamic_counter(self) -> tf.Tensor | None:
        """Consecutive finite steps since the scale last changed; None for a static scale
        (as in Keras 3 and tf.keras, where only a dynamic scale has a counter)."""
        if not self.dynamic:
            return None
        return tf.convert_to_tensor(self._state_vars[1].value)

    @property
    def skipped_steps(self) -> tf.Tensor:
        """Total number of skipped (non-finite) steps."""
        return tf.convert_to_tensor(self._state_vars[2].value)

    def loss_scale_metrics(self) -> dict[str, tf.Tensor]:
        """``{"loss_scale": ..., "skipped_steps": ...}`` for logs, progress bars, TensorBoard."""
        return {
            "loss_scale": self.loss_scale,
            "skipped_steps": tf.cast(
                self.skipped_steps, tf.float32
            ),
        }
