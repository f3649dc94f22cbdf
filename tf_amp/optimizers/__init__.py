"""Loss-scaling optimizer wrappers; ``LossScaleOptimizer`` picks the one for the inner type.

Keras 3 optimizers get ``tf_amp.optimizers.keras.KerasLossScaleOptimizer`` (itself a Keras
optimizer); ``tf.compat.v1.train.Optimizer`` instances get
``tf_amp.optimizers.v1.V1LossScaleOptimizer`` (itself a v1 optimizer). Both share the
``tf_amp.loss_scale`` state machine and the fused unscale + finite-check op.
"""

from __future__ import annotations

from typing import Any

from tf_amp.optimizers import _common


def is_keras_optimizer(optimizer: Any) -> bool:
    import keras

    return isinstance(optimizer, keras.optimizers.Optimizer)


def is_v1_optimizer(optimizer: Any) -> bool:
    import tensorflow as tf

    return isinstance(optimizer, tf.compat.v1.train.Optimizer)


def LossScaleOptimizer(inner: Any, loss_scale: Any = "dynamic", **kwargs: Any) -> Any:  # noqa: N802
    """Wraps ``inner`` with loss scaling; returns an optimizer of the same family.

    Typical use::

        opt = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(1e-3))          # Keras 3
        opt = tf_amp.LossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(), 128.0)  # TF1, static
        gen_opt, disc_opt = (tf_amp.LossScaleOptimizer(keras.optimizers.Adam()) for _ in "gd")

    Args:
      inner: a Keras 3 optimizer or a ``tf.compat.v1.train.Optimizer``.
      loss_scale: ``"dynamic"`` (default), a number for a static scale, or a
        ``tf_amp.LossScale``.
      **kwargs: ``enabled``, ``floor_warning_skips``, ``max_consecutive_skips``, ``name``.

    Raises:
      ValueError: ``inner`` already scales the loss (a tf_amp or Keras loss-scale optimizer).
      TypeError: ``inner`` is not an optimizer tf_amp supports; the message says what to pass.
    """
    _common.check_not_wrapped(inner)
    if is_v1_optimizer(inner):  # first: needs only TensorFlow, never imports Keras
        from tf_amp.optimizers.v1 import V1LossScaleOptimizer

        return V1LossScaleOptimizer(inner, loss_scale=loss_scale, **kwargs)
    if is_keras_optimizer(inner):
        from tf_amp.optimizers.keras import KerasLossScaleOptimizer

        return KerasLossScaleOptimizer(inner, loss_scale=loss_scale, **kwargs)
    hint = ""
    module = type(inner).__module__
    if module.startswith("tf_keras") or "keras.optimizers.legacy" in module:
        hint = " (legacy tf_keras optimizers are not supported; use keras.optimizers.*)"
    elif isinstance(inner, str):
        hint = f" (a string such as {inner!r} is not an optimizer; build it first)"
    raise TypeError(
        f"tf_amp.LossScaleOptimizer cannot wrap {type(inner).__module__}."
        f"{type(inner).__name__}{hint}; {_common.SUPPORTED_MESSAGE}"
    )


def __getattr__(name: str) -> Any:
    # LossScaleCallback needs keras; resolve it lazily so v1-only users never import keras.
    if name == "LossScaleCallback":
        from tf_amp.optimizers.keras import LossScaleCallback

        return LossScaleCallback
    raise AttributeError(f"module 'tf_amp.optimizers' has no attribute {name!r}")


__all__ = ["LossScaleOptimizer", "LossScaleCallback", "is_keras_optimizer", "is_v1_optimizer"]
