"""The tf_keras wrappers' loss-scale state: its variables, its checkpoint entry, and the names
users read and set it by (tf.keras 2.x's ``loss_scale``, ``dynamic``, ``initial_scale``...).

Apart from the step logic (:mod:`tf_amp.optimizers._tf_keras_scaling`) because the state is
what checkpoints see: the entry's layout is tf_keras's, so checkpoints of tf_keras's own
``LossScaleOptimizer`` restore the scale here. Keras 3's wrapper keeps its state in Keras
optimizer variables instead (:mod:`tf_amp.optimizers._keras_state`); nothing is shared but
``LossScaleState``'s field order.
"""

from __future__ import annotations

import tensorflow as tf

from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.loss_scale._base import checked_scale
from tf_amp.optimizers._host_floor_alarm import ChecksSkipsOnHost
from tf_amp.optimizers._policy_views import PolicyViews


def create_state_variables(policy: LossScale) -> list[tf.Variable]:
    """One variable per ``LossScaleState`` field, at the policy's initial values, created now
    (under ``init_scope``) so a checkpoint restore lands before the first step."""
    with tf.init_scope():
        initial = policy.initial_state()
        return [
            tf.Variable(
                value,
                name=f"loss_scale_{field}",
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_WRITE,
                # every replica computes the same state (the finite flag is ANDed)
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            for field, value in zip(LossScaleState._fields, initial, strict=True)
        ]


class TfKerasScaleState(ChecksSkipsOnHost, PolicyViews):
    """Mixin: the scale, its counters and its policy, read (and the scale set) by name."""

    _policy: LossScale
    _state_vars: list[tf.Variable]
    _tf_amp_name: str
    enabled: bool

    @property
    def name(self) -> str:
        return self._tf_amp_name

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current scale (float32 scalar); 1 when disabled."""
        if not self.enabled:
            return tf.constant(1.0)
        return tf.convert_to_tensor(self._state_vars[0])

    def set_loss_scale(self, value: float) -> None:
        """Sets the current scale, e.g. to change a static scale mid-training."""
        self._state_vars[0].assign(checked_scale(value, "the loss scale"))

    @property
    def dynamic_counter(self) -> tf.Tensor | None:
        """Consecutive finite steps since the scale last changed; None for a static scale."""
        return tf.convert_to_tensor(self._state_vars[1]) if self.dynamic else None

    @property
    def skipped_steps(self) -> tf.Tensor:
        """Total number of skipped (non-finite) steps."""
        return tf.convert_to_tensor(self._state_vars[2])

    def loss_scale_metrics(self) -> dict[str, tf.Tensor]:
        """``{"loss_scale": ..., "skipped_steps": ...}`` for logs and TensorBoard."""
        return {
            "loss_scale": self.loss_scale,
            "skipped_steps": tf.cast(self.skipped_steps, tf.float32),
        }
