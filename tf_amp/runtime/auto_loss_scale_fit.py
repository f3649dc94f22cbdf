"""Loss scaling for unmodified Keras ``fit`` scripts (environment activation only).

``Model.compile`` wraps the script's optimizer in a dynamic ``tf_amp.LossScaleOptimizer``
(:func:`wrap_on_compile`, which the activation hands to the Keras adapter's compile patch);
Keras's ``fit`` then scales the loss through it. Saved files stay those of a float32 run: the
wrapper is marked ``saves_as_inner``, and the legacy ``.h5`` writer is patched
(:func:`h5_save_patch`) to store the script's own optimizer.
"""

from __future__ import annotations

import logging
from typing import Any

import keras

from tf_amp._say_once import say_once
from tf_amp.optimizers import LossScaleOptimizer, _common
from tf_amp.runtime import settings
from tf_amp.runtime._own_train_step import has_own_train_step
from tf_amp.runtime.auto_loss_scale import STATE_NAME


def wrap_on_compile(model: Any, optimizer: Any) -> Any:
    """Under env loss scaling, a plain Keras optimizer gets a dynamic LossScaleOptimizer.

    Not for a model with its own ``train_step``: an unmodified float32 ``train_step`` never
    calls ``optimizer.scale_loss``, so a wrapper would divide true gradients by the scale.
    Such steps are loss-scaled by the ``GradientTape.gradient`` / ``apply`` patches instead
    (:mod:`tf_amp.runtime.auto_loss_scale`), which scale and unscale around the user's own
    ``tape.gradient`` call.

    Also left as they are: no optimizer (``compile(optimizer=None)`` for a model that only
    evaluates or predicts), and one with Keras's ``loss_scale_factor``, which scales its loss
    itself (a wrapper would refuse it: the loss would be scaled twice).
    """
    if (
        optimizer is None
        or not settings.loss_scaling_enabled_globally()
        or has_own_train_step(model)
    ):
        return optimizer
    resolved = keras.optimizers.get(optimizer)
    if isinstance(resolved, keras.optimizers.LossScaleOptimizer):
        return resolved  # Keras's wrapper, or tf_amp's (a subclass of it): scaled already
    if getattr(resolved, "loss_scale_factor", None) is not None:
        say_once(
            "auto loss scale: loss_scale_factor",
            logging.INFO,
            f"the optimizer's loss_scale_factor={resolved.loss_scale_factor} is kept: Keras "
            "scales the loss by it, so the environment adds no dynamic loss scaling to "
            "this model (steps with inf/NaN gradients are applied, as without tf_amp)",
        )
        return resolved
    existing = _common.wrapper_of(resolved)
    if getattr(existing, "saves_as_inner", False):
        return existing  # a recompile with the same optimizer keeps its scale
    wrapper = LossScaleOptimizer(resolved, loss_scale="dynamic")
    wrapper.saves_as_inner = True  # .keras files keep the script's optimizer (see compile)
    # The script holds the optimizer it passed, not the wrapper: tracking the wrapper on it makes
    # tf.train.Checkpoint(optimizer=opt) save and restore the scale too (Checkpoint(model=...)
    # already does, through model.optimizer). TensorFlow tracking only: Keras files unchanged.
    # Only the state: the wrapper's own checkpoint children are the optimizer's.
    resolved._track_trackable(wrapper._state_checkpoint, STATE_NAME, overwrite=True)  # noqa: SLF001
    return wrapper


def h5_save_patch(original: Any) -> Any:
    """Keras's legacy ``.h5`` writer that stores the script's own optimizer.

    The ``.h5`` format stores the optimizer's class, config and ``variables``; for the wrapper
    the environment put around a script's optimizer that would be ``tf_amp>...``, which plain
    Keras cannot load. During the save the model holds the inner optimizer instead, so the
    file is the one a float32 run writes (the loss-scale state is not in it: loaded under the
    environment, the scale starts afresh, as after a float32 checkpoint).
    """

    def save_model_to_hdf5(model: Any, *args: Any, **kwargs: Any) -> Any:
        with _common.holding_inner_optimizer(model):
            return original(model, *args, **kwargs)

    save_model_to_hdf5.__wrapped__ = original  # type: ignore[attr-defined]
    return save_model_to_hdf5
