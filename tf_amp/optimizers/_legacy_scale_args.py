"""tf.keras 2.x's and Keras 3's loss-scale arguments, accepted by every Keras-family wrapper.

``tf.keras.mixed_precision.LossScaleOptimizer`` (TF2, and tf_keras today) and
``keras.optimizers.LossScaleOptimizer`` take ``dynamic``, ``initial_scale`` and
``dynamic_growth_steps``; tf_amp's wrappers take ``loss_scale``. Both the Keras 3 wrapper and
the tf_keras wrappers accept the old names too, so code written for those classes switches by
changing the class alone. One implementation, so both wrappers read the arguments the same
way and say the same thing about a wrong combination.

Imports neither Keras nor tf_keras: each wrapper family imports it without loading the other.
"""

from __future__ import annotations

from typing import Any

from tf_amp import loss_scale as loss_scale_lib
from tf_amp.loss_scale._base import checked_scale

LEGACY_SCALE_ARGS = ("dynamic", "initial_scale", "dynamic_growth_steps")
"""The argument (and config key) names of the Keras and tf.keras loss-scale optimizers."""


def legacy_loss_scale(loss_scale: Any, kwargs: dict[str, Any]) -> Any:
    """Pops :data:`LEGACY_SCALE_ARGS` from ``kwargs``; returns ``loss_scale`` when there were
    none, else the policy they describe (an error when ``loss_scale`` was given as well)."""
    legacy = {k: kwargs.pop(k) for k in LEGACY_SCALE_ARGS if k in kwargs}
    if not legacy:
        return loss_scale
    if not isinstance(legacy.get("dynamic", True), bool):
        raise TypeError(
            f"dynamic must be True or False, got {legacy['dynamic']!r}; for a dynamic scale "
            "pass dynamic=True (or loss_scale=\"dynamic\"), for a fixed one dynamic=False "
            "with initial_scale=..."
        )
    if loss_scale != "dynamic":
        raise ValueError(
            f"pass either loss_scale or {sorted(legacy)}, not both (got loss_scale={loss_scale!r})"
        )
    if legacy.get("dynamic", True):
        return keras_dynamic_scale(
            _or_default(legacy.get("initial_scale"), 2.0**15),
            _or_default(legacy.get("dynamic_growth_steps"), 2000),
        )
    if legacy.get("dynamic_growth_steps") is not None:
        raise ValueError("dynamic_growth_steps has no meaning with dynamic=False")
    return loss_scale_lib.StaticLossScale(_or_default(legacy.get("initial_scale"), 2.0**15))


def keras_dynamic_scale(initial_scale: Any, growth_steps: Any, **factors: float) -> Any:
    """The dynamic policy of Keras's ``initial_scale`` / ``dynamic_growth_steps``.

    Keras's scale has no bounds; tf_amp's stays in [1, 2**24] by default (below 1 a skipped
    step only shrinks gradients further; above 2**24 a float16 loss overflows). A scale Keras
    accepts outside them (a saved config, ``initial_scale=2**30``) widens that bound to itself
    rather than fail or be silently clamped, so such code and files still load.
    """
    initial = checked_scale(initial_scale, "initial_scale")
    return loss_scale_lib.DynamicLossScale(
        initial_scale=initial,
        growth_interval=growth_steps,
        min_scale=min(1.0, initial),
        max_scale=max(2.0**24, initial),
        **factors,
    )


def _or_default(value: Any, default: Any) -> Any:
    """TF2's signature defaults these arguments to None, meaning "the default"."""
    return default if value is None else value
