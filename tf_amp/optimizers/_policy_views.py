"""Read-only views of a wrapper's loss-scale policy, by the names users of every Keras know.

Shared by the Keras 3 and tf_keras wrappers (``dynamic``, ``initial_scale`` and
``dynamic_growth_steps`` are the attributes of Keras's and tf.keras 2.x's own
``LossScaleOptimizer``); the class using it holds the policy as ``self._policy``.
"""

from __future__ import annotations

from tf_amp.loss_scale import LossScale


class PolicyViews:
    """``loss_scale_policy``, ``dynamic``, ``initial_scale``, ``dynamic_growth_steps``."""

    _policy: LossScale

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
