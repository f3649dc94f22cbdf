"""Loss scaling for tf_keras (Keras 2) optimizers, current and legacy, with tf.keras 2.x's API.

Since TensorFlow 2.16, ``tf.keras`` is Keras 3 unless ``tf_keras`` is installed and
``TF_USE_LEGACY_KERAS=1`` is set; code bases that kept their Keras 2 models get here.
``tf_amp.LossScaleOptimizer(opt)`` returns, for

* a ``tf_keras.optimizers.*`` optimizer: :class:`TfKerasLossScaleOptimizer`;
* a ``tf_keras.optimizers.legacy.*`` one: :class:`TfKerasLegacyLossScaleOptimizer`.

Both are tf_keras optimizers of the inner optimizer's kind, and subclasses of tf_keras's own
``LossScaleOptimizer`` classes (see ``tf_amp._upstream.tf_keras`` for why), so ``compile``,
``fit``, ``model.save`` and ``tf.train.Checkpoint`` take them unchanged. Everything that decides
a step is tf_amp's, as for Keras 3: one fused native op unscales and checks all gradients, the
flag is ANDed over replicas, a ``tf.cond`` applies the inner optimizer or skips the step, and a
skipped step leaves weights, slots and ``iterations`` untouched (tf_keras's own wrapper counted
skipped steps in ``iterations``).

Typical use (the tf.keras 2.x custom loop)::

    opt = tf_amp.LossScaleOptimizer(tf_keras.optimizers.Adam(1e-3))
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(loss_fn())
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))    # skipped on inf/nan

``minimize`` (what tf_keras's ``Model.train_step`` calls) scales the loss and applies with a
single fused unscale-and-check. Checkpoints keep tf_keras's layout: the inner optimizer's own
names plus a ``loss_scale`` entry (``current_loss_scale``, ``good_steps``, ... ), so a checkpoint
of tf_keras's own ``LossScaleOptimizer`` restores its scale here, and checkpoints move between
the wrapper and the plain optimizer (``expect_partial()`` for the scale one way).

This module is the tf_keras family's entry point (``tf_amp.LossScaleOptimizer`` calls
:func:`wrap`); the wrappers live in modules of one concept each:

* :mod:`tf_amp.optimizers._tf_keras_current` / :mod:`tf_amp.optimizers._tf_keras_legacy`: the
  two wrapper classes, which differ in their optimizer API only;
* :mod:`tf_amp.optimizers._tf_keras_scaling`: what they share (construction, the custom-loop
  API, the step);
* :mod:`tf_amp.optimizers._tf_keras_state`: the state variables and their checkpoint entry;
* :mod:`tf_amp.optimizers._tf_keras_config`: ``get_config`` / ``from_config``;
* :mod:`tf_amp.optimizers._legacy_scale_args`: the ``dynamic`` / ``initial_scale`` /
  ``dynamic_growth_steps`` arguments, shared with the Keras 3 wrapper.
"""

from __future__ import annotations

from typing import Any

from tf_amp._upstream import tf_keras as upstream
from tf_amp.optimizers._apply_or_skip import KeepWhole
from tf_amp.optimizers._tf_keras_current import TfKerasLossScaleOptimizer
from tf_amp.optimizers._tf_keras_legacy import TfKerasLegacyLossScaleOptimizer


def wrap(inner: Any, loss_scale: Any = "dynamic", **kwargs: Any) -> Any:
    """The tf_amp wrapper for a tf_keras optimizer (legacy or current)."""
    cls = (
        TfKerasLegacyLossScaleOptimizer
        if upstream.is_legacy_optimizer(inner)
        else TfKerasLossScaleOptimizer
    )
    return cls(inner, loss_scale=loss_scale, **kwargs)


__all__ = ["KeepWhole", "TfKerasLegacyLossScaleOptimizer", "TfKerasLossScaleOptimizer", "wrap"]
