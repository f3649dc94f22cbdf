"""The Keras wrapper's loss-scale state: its variables, and the names users read and set it by
(Keras 3 / tf.keras names).

A mixin of :class:`tf_amp.optimizers.keras.KerasLossScaleOptimizer`, which sets the policy
(``_policy``) and ``enabled`` before calling :meth:`LossScaleStateOwner._create_state`.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tf_amp._upstream.keras import no_automatic_dependency_tracking
from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.loss_scale._base import checked_scale
from tf_amp.optimizers import _checkpoint_layout
from tf_amp.optimizers._host_floor_alarm import ChecksSkipsOnHost, HostFloorAlarm
from tf_amp.optimizers._policy_views import PolicyViews


class LossScaleStateOwner(ChecksSkipsOnHost, PolicyViews):
    """Creates the state variables (one per ``LossScaleState`` field); reads and sets the
    scale, its counters and its policy."""

    _state_vars: list[Any]
    _policy: LossScale
    enabled: bool
    floor_warning_skips: int
    max_consecutive_skips: int | None

    @no_automatic_dependency_tracking
    def _create_state(self) -> None:
        """Creates the loss-scale variables now, as Keras creates ``iterations`` in __init__.

        They depend on no model variable, and existing before ``build`` is what makes them
        readable before the first step and what lets ``tf.train.Checkpoint.restore`` into a
        fresh wrapper land at once, so the first ``scale_loss`` already uses the restored scale.
        """
        initial = [self._policy.initial_scale] + [0] * (len(LossScaleState._fields) - 1)
        self._state_vars = [
            self.add_variable(
                shape=(),
                dtype="float32" if field == "scale" else "int64",
                initializer=keras.initializers.Constant(float(value)),
                aggregation="only_first_replica",
                name=f"loss_scale_{field}",
            )
            for field, value in zip(LossScaleState._fields, initial, strict=True)
        ]
        self._host_floor_alarm = HostFloorAlarm()
        self._state_checkpoint = _checkpoint_layout.StateTrackable(
            self._state_vars, self._host_floor_alarm.events.counts
        )

    def _state(self) -> LossScaleState:
        return LossScaleState(*(v.value for v in self._state_vars))

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
        self._state_vars[0].assign(checked_scale(value, "the loss scale"))

    @property
    def dynamic_counter(self) -> tf.Tensor | None:
        """Consecutive finite steps since the scale last changed; None for a static scale
        (as in Keras 3 and tf.keras, where only a dynamic scale has a counter)."""
        if not self.dynamic:
            return None
        return tf.convert_to_tensor(self._state_vars[1].value)

    @property
    def dynamic_scale(self) -> Any:
        """The scale's variable, under Keras 3's name for it (code written for
        ``keras.optimizers.LossScaleOptimizer`` reads and assigns it). The variable itself,
        also when the wrapper is disabled (then ``loss_scale`` says 1 and this is unused)."""
        return self._state_vars[0]

    @property
    def step_counter(self) -> Any:
        """The variable counting finite steps since the scale last changed, under Keras 3's
        name for it (``dynamic_counter`` reads its value)."""
        return self._state_vars[1]

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
