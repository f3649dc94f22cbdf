"""Read-only views of a wrapper's loss-scale policy, by the names users of every Keras know.

Shared by the Keras 3 and tf_keras wrappers (``dynamic``, ``initial_scale`` and
``dynamic_growth_steps`` are the attributes of Keras's and tf.keras 2.x's own
``LossScaleOptimizer``); the class using it holds the policy as ``self._policy`` and its
switch as ``self.enabled``. A disabled wrapper (``enabled=False``, the pass-through that
``enable_mixed_precision_graph_rewrite`` returns for a bfloat16 or float32 target) scales by 1
and never moves the scale, so these views say that (not dynamic, initial scale 1, no growth
steps) rather than the policy it would use if enabled, which ``loss_scale_policy`` and
``get_config`` keep.
"""

from __future__ import annotations

from tf_amp.loss_scale import LossScale


class PolicyViews:
    """``loss_scale_policy``, ``dynamic``, ``initial_scale``, ``dynamic_growth_steps``."""

    _policy: LossScale
    enabled: bool

    @property
    def loss_scale_policy(self) -> LossScale:
        """The ``tf_amp.LossScale`` (static or dynamic) that moves the scale when enabled."""
        return self._policy

    @property
    def dynamic(self) -> bool:
        return self.enabled and self._policy.dynamic

    @property
    def initial_scale(self) -> float:
        return self._policy.initial_scale if self.enabled else 1.0

    @property
    def dynamic_growth_steps(self) -> int | None:
        return getattr(self._policy, "growth_interval", None) if self.enabled else None
