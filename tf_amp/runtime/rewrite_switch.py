"""The switch ``enable_mixed_precision_graph_rewrite`` turns: mark an optimizer, hook Keras.

Below the optimizer wrappers on purpose: a saved, marked Keras wrapper loaded by ``load_model``
(``KerasLossScaleOptimizer.from_config``) turns the switch on too, so a resumed run keeps the
rewrite; that call must not reach up to :mod:`tf_amp.enable`, which builds wrappers.
"""

from __future__ import annotations

import sys
from typing import Any

from tf_amp.runtime import _state


def mark_for_rewrite(wrapped: Any) -> Any:
    """Marks a tf_amp wrapper as wanting the rewrite and turns the rewrite on (what ``enable_``
    does after wrapping; also run when a saved, marked Keras wrapper is loaded, so a resumed
    run keeps both the rewrite and its restored loss scale).

    For a Keras optimizer it also installs the compile hook, which makes
    ``model.compile(optimizer=wrapped)`` hook that model's fit / evaluate / predict; for a
    tf_keras one, the fit / evaluate / predict builders of ``tf_keras.Model``.
    """
    _state.mark_optimizer(wrapped)
    with _state.LOCK:
        _state.set_rewrite_enabled(True)
        if _is_keras_optimizer(wrapped):
            # On use: the Keras adapter loads the rewriter, which a TF1-only run never needs.
            from tf_amp.runtime import keras_fit

            keras_fit.install_compile_hook()
        elif _is_tf_keras_optimizer(wrapped):
            # tf_keras models build fit/evaluate/predict rewritten when their optimizer is
            # marked (tf_amp.runtime.tf_keras_fit).
            from tf_amp.runtime import tf_keras_fit

            tf_keras_fit.hook("enable")
    return wrapped


def turn_off() -> None:
    """Turns the process-wide flag off and releases the compile hook ``mark_for_rewrite``
    installed (the environment activation keeps its own hold on ``compile``)."""
    with _state.LOCK:
        _state.set_rewrite_enabled(False)
        if "tf_amp.runtime.keras_fit" in sys.modules:  # else no hook was ever installed
            sys.modules["tf_amp.runtime.keras_fit"].uninstall_compile_hook()
        if "tf_amp.runtime.tf_keras_fit" in sys.modules:
            sys.modules["tf_amp.runtime.tf_keras_fit"].unhook("enable")


def _is_tf_keras_optimizer(optimizer: Any) -> bool:
    from tf_amp._upstream import tf_keras  # never imports tf_keras itself

    return tf_keras.is_optimizer(optimizer)


def _is_keras_optimizer(optimizer: Any) -> bool:
    keras = sys.modules.get("keras")  # a Keras optimizer exists only once Keras is loaded
    return keras is not None and isinstance(optimizer, keras.optimizers.Optimizer)
