"""Loss-scaling optimizer wrappers; ``LossScaleOptimizer`` picks the one for the inner type.

Keras 3 optimizers get ``tf_amp.optimizers.keras.KerasLossScaleOptimizer`` (itself a Keras
optimizer); tf_keras ones (``tf_keras.optimizers.*`` and ``.legacy.*``) the wrappers of
``tf_amp.optimizers.tf_keras``; ``tf.compat.v1.train.Optimizer`` instances get
``tf_amp.optimizers.v1.V1LossScaleOptimizer`` (itself a v1 optimizer). All share the
``tf_amp.loss_scale`` state machine and the fused unscale + finite-check op.
"""

from __future__ import annotations

import os
from typing import Any

from tf_amp.optimizers import _common


def is_keras_optimizer(optimizer: Any) -> bool:
    import keras

    return isinstance(optimizer, keras.optimizers.Optimizer)


def is_v1_optimizer(optimizer: Any) -> bool:
    import tensorflow as tf

    return isinstance(optimizer, tf.compat.v1.train.Optimizer)


def is_tf_keras_optimizer(optimizer: Any) -> bool:
    """True for a tf_keras (Keras 2) optimizer, current or legacy; never imports tf_keras."""
    from tf_amp._upstream import tf_keras

    return tf_keras.is_optimizer(optimizer)


def _wrap(inner: Any, loss_scale: Any = "dynamic", **kwargs: Any) -> Any:
    _common.check_not_wrapped(inner)
    if is_v1_optimizer(inner):  # first: needs only TensorFlow, never imports Keras
        from tf_amp.optimizers.v1 import V1LossScaleOptimizer

        return V1LossScaleOptimizer(inner, loss_scale=loss_scale, **kwargs)
    if is_keras_optimizer(inner):
        from tf_amp.optimizers.keras import KerasLossScaleOptimizer

        return KerasLossScaleOptimizer(inner, loss_scale=loss_scale, **kwargs)
    # --- tf_keras (Keras 2) hook: its optimizers get the wrappers of optimizers/tf_keras.py.
    if is_tf_keras_optimizer(inner):
        from tf_amp.optimizers.tf_keras import wrap

        return wrap(inner, loss_scale=loss_scale, **kwargs)
    # --- end of the tf_keras hook
    hint = ""
    if isinstance(inner, str):
        hint = f" (a string such as {inner!r} is not an optimizer; build it first)"
    raise TypeError(
        f"tf_amp.LossScaleOptimizer cannot wrap {type(inner).__module__}."
        f"{type(inner).__name__}{hint}; {_common.SUPPORTED_MESSAGE}"
    )



class _LossScaleOptimizerType(type):
    """Makes ``tf_amp.LossScaleOptimizer`` a factory that is also a class to test against.

    Calling it returns the wrapper of the inner optimizer's family (Keras 3, tf_keras or v1),
    as tf.keras 2.x's metaclass did; ``isinstance(opt, tf_amp.LossScaleOptimizer)`` is True for
    every wrapper it returns, whatever the family.
    """

    def __call__(cls, inner: Any, loss_scale: Any = "dynamic", **kwargs: Any) -> Any:
        return _wrap(inner, loss_scale, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        return _common.is_tf_amp_wrapper(instance)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return bool(getattr(subclass, "_tf_amp_loss_scale_wrapper", False))


class LossScaleOptimizer(metaclass=_LossScaleOptimizerType):
    """Wraps ``inner`` with loss scaling; returns an optimizer of the same family.

    Typical use::

        opt = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(1e-3))          # Keras 3
        opt = tf_amp.LossScaleOptimizer(tf.compat.v1.train.AdamOptimizer(), 128.0)  # TF1, static
        gen_opt, disc_opt = (tf_amp.LossScaleOptimizer(keras.optimizers.Adam()) for _ in "gd")

    Args:
      inner: a Keras 3 optimizer, a ``tf.compat.v1.train.Optimizer``, or a tf_keras one
        (``tf_keras.optimizers.*`` or ``.legacy.*``).
      loss_scale: ``"dynamic"`` (default), a number for a static scale, or a
        ``tf_amp.LossScale``.
      **kwargs: ``enabled``, ``floor_warning_skips``, ``max_consecutive_skips``, ``name``.

    Raises:
      ValueError: ``inner`` already scales the loss (a tf_amp or Keras loss-scale optimizer).
      TypeError: ``inner`` is not an optimizer tf_amp supports; the message says what to pass.
    """

    @staticmethod
    def from_config(config: dict[str, Any], custom_objects: dict[str, Any] | None = None) -> Any:
        """A wrapper from tf_amp's config or Keras 3's, tf.keras 2.x's or TF 2.3's.

        A Keras 3 wrapper (tf.keras 2.x's configs are Keras 3's migration path), except in the
        tf_keras world: a tf_keras legacy inner optimizer (which Keras 3 cannot build), or
        ``TF_USE_LEGACY_KERAS=1`` (``tf.keras`` is tf_keras), gives the tf_keras wrapper."""
        family = _tf_keras_family(config)
        if family is not None:
            from tf_amp.optimizers import tf_keras

            cls = (tf_keras.TfKerasLegacyLossScaleOptimizer if family == "legacy"
                   else tf_keras.TfKerasLossScaleOptimizer)
            return cls.from_config(config, custom_objects)
        from tf_amp.optimizers.keras import KerasLossScaleOptimizer

        return KerasLossScaleOptimizer.from_config(config, custom_objects)


# Keys only Keras 3 optimizers write in their configs (tf_keras's write is_legacy_optimizer).
_KERAS3_ONLY_KEYS = frozenset({"loss_scale_factor", "gradient_accumulation_steps"})


def _tf_keras_family(config: dict[str, Any]) -> str | None:
    """"legacy" / "current" when ``config`` is to become a tf_keras wrapper; None for Keras 3.

    Read from the inner optimizer's config first: a legacy module or ``is_legacy_optimizer``
    is tf_keras's legacy family, Keras 3's own keys are Keras 3 whatever the environment. A
    current tf_keras config (tf.keras 2.x's too) is Keras 3's to migrate, unless
    ``TF_USE_LEGACY_KERAS`` says tf.keras is tf_keras."""
    inner = config.get("inner_optimizer", config.get("optimizer"))
    if not isinstance(inner, dict):
        return None
    module = inner.get("module") or ""
    inner_config = inner.get("config") or {}
    if module.endswith(".legacy") or inner_config.get("is_legacy_optimizer") is True:
        return "legacy"
    if _KERAS3_ONLY_KEYS.intersection(inner_config):
        return None
    if os.environ.get("TF_USE_LEGACY_KERAS", "") in ("1", "true", "True"):
        return "current"
    return None


def custom_objects() -> dict[str, Any]:
    """``custom_objects`` for ``load_model`` of a file saved with a wrapper.

    Not needed where ``tf_amp`` is imported, before or after Keras or tf_keras (that registers
    the classes with them); useful where the loading code imports nothing from tf_amp. Holds
    the tf_keras wrappers too once tf_keras is imported (this does not import it).
    """
    import sys

    from tf_amp.optimizers.keras import KerasLossScaleOptimizer

    found: dict[str, Any] = {"tf_amp>KerasLossScaleOptimizer": KerasLossScaleOptimizer}
    if "tf_keras" in sys.modules:
        from tf_amp.optimizers import tf_keras

        for cls in (tf_keras.TfKerasLossScaleOptimizer, tf_keras.TfKerasLegacyLossScaleOptimizer):
            found[f"tf_amp>{cls.__name__}"] = cls
    return found


def __getattr__(name: str) -> Any:
    if name == "LossScaleCallback":
        from tf_amp.optimizers.keras import LossScaleCallback

        return LossScaleCallback
    raise AttributeError(f"module 'tf_amp.optimizers' has no attribute {name!r}")


__all__ = [
    "LossScaleCallback",
    "LossScaleOptimizer",
    "custom_objects",
    "is_keras_optimizer",
    "is_tf_keras_optimizer",
    "is_v1_optimizer",
]
