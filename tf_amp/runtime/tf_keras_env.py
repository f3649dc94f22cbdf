"""``TF_ENABLE_AUTO_MIXED_PRECISION`` for tf_keras (Keras 2) scripts: what it patches and why.

With ``TF_USE_LEGACY_KERAS=1`` an unmodified tf.keras 2.x script reaches tf_keras, not Keras 3.
The environment activation (:mod:`tf_amp.runtime.activation`) calls :func:`activate` when
tf_keras is imported (or at once if it already is); these patches mirror the Keras 3 ones:

* graph rewrite: ``tf_keras.Model.make_{train,test,predict}_function`` build tf_keras's own
  function and run it rewritten (:mod:`tf_amp.runtime.tf_keras_fit`);
* loss scaling, ``fit`` with tf_keras's ``train_step``: ``tf_keras.Model.compile`` wraps the
  optimizer in ``tf_amp.LossScaleOptimizer`` (tf_keras's ``minimize`` then scales the loss
  and skips non-finite steps). A model with its own ``train_step`` keeps its optimizer: its
  step never calls ``get_scaled_loss``, so a wrapper would divide true gradients by the scale;
* loss scaling, custom ``train_step`` or ``tf.GradientTape`` loop: ``tape.gradient`` called from
  user code is scaled and unscaled by TensorFlow's patch (:mod:`tf_amp.runtime.auto_loss_scale`),
  and ``apply_gradients`` of every tf_keras optimizer (current and legacy) applies those
  gradients only when they are finite, moving the same process-wide scale as Keras 3's loops.
  tf_keras's own ``LossScaleOptimizer.get_scaled_loss`` marks the loss it scales, which that
  patch then leaves alone (:mod:`tf_amp.optimizers._scaled_losses`).

All patches are held in the one registry (:mod:`tf_amp.runtime._patches`) under the
environment's tf_keras holder (``tf_keras_fit.HOLDERS["env"]``); :func:`deactivate` restores
every attribute exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_amp._upstream import tf_keras as upstream
from tf_amp.runtime import tf_keras_fit
from tf_amp.runtime._own_train_step import has_own_train_step

TAG = "env"


def activate(*, graph_rewrite: bool, loss_scaling: bool) -> None:
    """Installs the patches for the halves the environment turned on."""
    if graph_rewrite:
        tf_keras_fit.hook(TAG)
    if loss_scaling:
        model = upstream.model_class()
        tf_keras_fit.acquire(TAG, model, "compile", compile_patch)
        for owner in upstream.save_model_owners():
            tf_keras_fit.acquire(TAG, owner, "save_model", save_model_patch)
        for base in upstream.optimizer_bases():
            tf_keras_fit.acquire(TAG, base, "apply_gradients", apply_gradients_patch)
        # tf_keras's own wrappers mark the loss they scale, so tape.gradient leaves it alone.
        from tf_amp.optimizers import _scaled_losses

        _, current, legacy = upstream.loss_scale_optimizer_classes()
        for wrapper in (current, legacy):
            tf_keras_fit.acquire(TAG, wrapper, "get_scaled_loss", _scaled_losses.marking_patch)


def deactivate() -> None:
    tf_keras_fit.unhook(TAG)


def _wrapped_for_env(optimizer: Any) -> Any:
    """A plain tf_keras optimizer (or its name) wrapped with a dynamic scale; anything that
    already scales the loss, or is not one optimizer, unchanged."""
    tf_keras = upstream.module()
    if not isinstance(optimizer, str) and not upstream.is_optimizer(optimizer):
        return optimizer
    resolved = tf_keras.optimizers.get(optimizer)
    if upstream.is_tf_keras_loss_scale_optimizer(resolved):
        return resolved  # tf_keras's own wrapper or tf_amp's: scaled already
    from tf_amp.optimizers import _common
    from tf_amp.optimizers.tf_keras import wrap

    existing = _common.wrapper_of(resolved)
    if existing is not None:
        return existing  # a recompile with the same optimizer keeps its scale
    # The scale is tracked on the inner optimizer too, so tf.train.Checkpoint(optimizer=opt)
    # with the script's own optimizer saves and restores it.
    wrapper = wrap(resolved, loss_scale="dynamic")
    object.__setattr__(wrapper, "saves_as_inner", True)  # see save_model_patch
    return wrapper


def save_model_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """tf_keras's ``save_model`` (``Model.save``; ``.keras``, ``.h5`` and SavedModel) that
    stores the script's own optimizer, not the wrapper the activation put around it.

    Saved as is, every format named ``tf_amp>TfKerasLossScaleOptimizer``, which a process
    without tf_amp cannot load. During the save the model holds the inner optimizer, so the
    file is the one a float32 run writes (the loss-scale state is not in it: loaded under the
    environment, the scale starts afresh; ``tf.train.Checkpoint`` keeps it).
    """

    def save_model(model: Any, *args: Any, **kwargs: Any) -> Any:
        from tf_amp.optimizers import _common

        with _common.holding_inner_optimizer(model):
            return original(model, *args, **kwargs)

    save_model.__wrapped__ = original  # type: ignore[attr-defined]
    return save_model


def compile_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``tf_keras.Model.compile`` that wraps the optimizer of a model using tf_keras's
    ``train_step`` (before tf_keras's own ``mixed_float16`` wrapping, which then sees a
    loss-scale optimizer and adds none)."""

    def compile(self: Any, optimizer: Any = "rmsprop", *args: Any, **kwargs: Any) -> Any:
        if not has_own_train_step(self):
            optimizer = _wrapped_for_env(optimizer)
        return original(self, optimizer, *args, **kwargs)

    compile.__wrapped__ = original  # type: ignore[attr-defined]
    compile.__doc__ = original.__doc__
    return compile


def apply_gradients_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """tf_keras ``apply_gradients`` that skips the step when the scaled ``tape.gradient`` call
    that produced these gradients overflowed (nothing changes for other gradients)."""
    from tf_amp.optimizers import _apply_or_skip, _common
    from tf_amp.optimizers._apply_or_skip import KeepWhole
    from tf_amp.runtime import auto_loss_scale

    def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        if _common.is_tf_amp_wrapper(self):
            return original(self, grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)
        finite = auto_loss_scale.take_finite_flag([g for g, _ in pairs])
        if finite is None:
            return original(self, pairs, *args, **kwargs)
        auto_loss_scale.attach_state(self)
        pairs = [(g, v) for g, v in pairs if g is not None]
        variables = [v for _, v in pairs]
        with tf.init_scope():  # slots and iterations: never inside the cond's branch
            if upstream.is_legacy_optimizer(self):
                upstream.create_legacy_slots(self, variables)
            else:
                self.build(variables)

        def inner_apply(grads: Any, wrapped: KeepWhole) -> Any:
            result = original(self, list(zip(grads, wrapped.value, strict=True)), *args, **kwargs)
            return result if isinstance(result, tf.Operation) else None

        done = _apply_or_skip.apply_if_finite(
            _apply_or_skip.all_replicas_finite(finite),
            inner_apply,
            [g for g, _ in pairs],
            KeepWhole(variables),
            auto_loss_scale.policy(),
            auto_loss_scale.state_variables(auto_loss_scale.optimizer_strategy(self)),
            floor_warning_skips=_common.FLOOR_WARNING_SKIPS,
            max_consecutive_skips=None,
        )
        if upstream.is_legacy_optimizer(self):
            return tf.group(*([done] if done is not None else []))
        return self.iterations

    apply_gradients.__wrapped__ = original  # type: ignore[attr-defined]
    return apply_gradients
