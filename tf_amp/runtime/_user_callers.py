"""Who called a patched method: user code, or TensorFlow / Keras / tf_amp themselves.

The environment's loss-scaling patches (``tape.gradient``, TF1 ``minimize`` /
``compute_gradients`` / ``apply_gradients``) act only for user code: TensorFlow's and Keras's
own calls to those methods must run as they are (Keras's ``fit`` scales through the wrapper
``compile`` put on the model's optimizer). Two framework calls count as the user's, because
nothing else would scale them: Keras 3's or tf_keras's own ``train_step`` run for a model with
a step of its own, and the gradients a plain tf_keras optimizer's ``minimize`` computes for
such code.
"""

from __future__ import annotations

import sys
from typing import Any

LIBRARY_MODULES = frozenset({"tensorflow", "keras", "tf_keras", "tf_amp", "absl", "tensorboard"})
"""Top-level packages whose code is not the user's."""


def is_user_caller(depth: int = 2) -> bool:
    """True when the code calling (``depth`` frames up) is user code, not TF/Keras/tf_amp.

    AutoGraph routes calls inside a converted function through its own ``converted_call``;
    those frames are skipped so the user's converted function is the one that decides.
    Two framework calls count as user code: Keras 3's ``train_step`` run for a model with a
    ``train_step`` of its own (:func:`_is_framework_step_for_an_own_step`), and the gradients
    a plain tf_keras optimizer's ``minimize`` computes for user code or for such a step
    (:func:`_is_tf_keras_minimize_for_the_user`).
    """
    from tf_amp._upstream.tensorflow import AUTOGRAPH_MODULE

    frame = sys._getframe(depth)  # noqa: SLF001
    while frame is not None:
        module = frame.f_globals.get("__name__", "") or ""
        if not module.startswith(AUTOGRAPH_MODULE):
            if module.split(".")[0] not in LIBRARY_MODULES:
                return True
            if module == _KERAS_TRAINER_MODULE:
                return _is_framework_step_for_an_own_step(frame)
            if module.startswith("tf_keras."):
                return _is_tf_keras_minimize_for_the_user(frame, AUTOGRAPH_MODULE)
            return False
        frame = frame.f_back
    return False


def user_call_site(depth: int = 2, frames: int = 8) -> tuple[tuple[str, int], ...]:
    """Where user code made the call ``depth`` frames up: ``(file, line)`` of each user frame
    above it (TF/Keras/tf_amp and AutoGraph frames skipped), innermost first, up to
    ``frames`` of them.

    The environment's eager custom loops learn per call site whether an ``apply`` takes the
    gradients a ``tape.gradient`` call there returns. The lines of the callers count too: a
    helper that computes gradients may be called for an update (applied) and for something
    else (Sharpness-Aware Minimization's perturbation) from two lines of one step."""
    from tf_amp._upstream.tensorflow import AUTOGRAPH_MODULE

    site: list[tuple[str, int]] = []
    frame = sys._getframe(depth)  # noqa: SLF001
    while frame is not None and len(site) < frames:
        module = frame.f_globals.get("__name__", "") or ""
        if not module.startswith(AUTOGRAPH_MODULE) and module.split(".")[0] not in LIBRARY_MODULES:
            site.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(site)


_KERAS_TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"


def _is_framework_step_for_an_own_step(frame: Any) -> bool:
    """True when ``frame`` is Keras 3's or tf_keras's own ``train_step`` running for a model
    that has a ``train_step`` of its own, i.e. called through ``super().train_step(data)``.

    ``compile`` left such a model's optimizer unwrapped (an own step written for float32 does
    not call ``scale_loss``; ``auto_loss_scale_fit.wrap_on_compile``), so the loss is scaled
    at the ``tape.gradient`` call, as in the user's own code; were the framework's call left
    alone, nothing would scale that step and its float16 gradients would underflow. Keras 3's
    step still calls the optimizer's ``scale_loss`` first, so a loss an explicit wrapper (or
    ``loss_scale_factor``) scaled is marked and left to it.
    """
    from tf_amp.runtime._own_train_step import has_own_train_step

    if frame.f_globals.get("__name__") == _KERAS_TRAINER_MODULE:
        from tf_amp._upstream.keras import TensorFlowTrainer

        framework_step = TensorFlowTrainer.train_step
    else:
        from tf_amp._upstream import tf_keras

        framework_step = tf_keras.model_class().train_step
    if frame.f_code is not framework_step.__code__:
        return False
    model = frame.f_locals.get("self")
    return model is not None and has_own_train_step(model)


_TF_KERAS_GRADIENT_METHODS = ("compute_gradients", "_compute_gradients", "_get_gradients")


def _is_tf_keras_minimize_for_the_user(frame: Any, autograph_module: str) -> bool:
    """True when ``frame`` computes gradients inside a plain tf_keras optimizer's ``minimize``
    that user code called (``optimizer.minimize(loss, vars, tape=tape)`` in a step of its
    own), or tf_keras's own ``train_step`` called for a model with a step of its own.

    Both leave the optimizer unwrapped, so the ``tape.gradient`` call inside ``minimize`` is
    the user's: scaled here, its flag taken by the patched ``apply_gradients`` that
    ``minimize`` calls next. A loss-scale wrapper's ``minimize`` is left to the wrapper.
    """
    if frame.f_code.co_name not in _TF_KERAS_GRADIENT_METHODS:
        return False
    optimizer = frame.f_locals.get("self")
    minimize = frame.f_back
    while (  # legacy: minimize -> _compute_gradients -> _get_gradients -> tape.gradient
        minimize is not None
        and minimize.f_code.co_name in _TF_KERAS_GRADIENT_METHODS
        and minimize.f_locals.get("self") is optimizer
    ):
        minimize = minimize.f_back
    if (
        minimize is None
        or minimize.f_code.co_name != "minimize"
        or minimize.f_locals.get("self") is not optimizer
    ):
        return False
    from tf_amp._upstream import tf_keras

    if tf_keras.is_tf_keras_loss_scale_optimizer(optimizer):  # tf_keras's own, or tf_amp's
        return False
    caller = minimize.f_back
    while caller is not None and caller.f_globals.get("__name__", "").startswith(autograph_module):
        caller = caller.f_back
    if caller is None:
        return False
    module = caller.f_globals.get("__name__", "") or ""
    if module.split(".")[0] not in LIBRARY_MODULES:
        return True
    return module.startswith("tf_keras.") and _is_framework_step_for_an_own_step(caller)

