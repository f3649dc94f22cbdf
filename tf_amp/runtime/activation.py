"""``TF_ENABLE_AUTO_MIXED_PRECISION``: the environment switch, its patches, and their reversal.

The NVIDIA container promise: set ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` and an unmodified script
trains in mixed precision with dynamic loss scaling. TensorFlow 2 silently ignores the variable;
with tf_amp installed, its startup hook (``tf_amp_autoenable.pth`` ->
:mod:`tf_amp.runtime.autoenable`) calls :func:`activate_from_env` when the variable is set. The
variables and what the target decides are described in :mod:`tf_amp.runtime.settings`.

What activation patches (every patch goes through the patch registry,
:mod:`tf_amp.runtime._patches`, and :func:`deactivate` restores the original attribute exactly,
unless ``enable_mixed_precision_graph_rewrite`` still holds it; modules not yet imported are
patched right after their import, so activation at startup does not import TensorFlow):

* graph rewrite: ``tf.function`` returns ``tf_amp.function`` for user functions (functions
  defined in TensorFlow's or Keras's own modules keep the original); ``tf.compat.v1.Session`` is
  ``tf_amp.Session`` and ``tf.compat.v1.InteractiveSession`` its interactive form;
  ``MonitoredSession`` / ``MonitoredTrainingSession`` / ``Supervisor`` get ``tf_amp.Session``
  from ``SessionManager`` (its module reference to ``session`` is patched); Keras's
  ``Trainer.compile`` (what ``keras.Model.compile`` resolves to) installs the rewritten
  ``fit``/``evaluate``/``predict`` step (:mod:`tf_amp.runtime.keras_fit`).
* loss scaling: the same ``compile`` patch wraps the optimizer in ``tf_amp.LossScaleOptimizer``
  (:mod:`tf_amp.runtime.auto_loss_scale_fit`); ``tf.compat.v1.train.Optimizer.minimize`` goes
  through a (cached) ``LossScaleOptimizer`` of the optimizer, and so do ``compute_gradients`` /
  ``apply_gradients`` called by user code, and ``Saver`` restores float32 checkpoints
  (:mod:`tf_amp.runtime.auto_loss_scale_v1`); in custom loops, ``tf.GradientTape.gradient``
  called from user code scales the loss and the next Keras ``optimizer.apply`` /
  ``apply_gradients`` skips the step on overflow (:mod:`tf_amp.runtime.auto_loss_scale`).

tf_keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``): once tf_keras is imported, the same halves are
applied to it by :mod:`tf_amp.runtime.tf_keras_env` (its builders, ``compile`` and optimizers'
``apply_gradients``), held in the one patch registry under its own holder and released by
:func:`deactivate`.

Scoping: nothing changes unless activated; :func:`activated` is a context manager for tests and
for turning it on around one region of a program.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tf_amp.runtime import _state, settings
from tf_amp.runtime._patches import ACTIVATION, REGISTRY
from tf_amp.runtime._post_import import PostImportHook
from tf_amp.runtime._user_callers import LIBRARY_MODULES, is_user_caller
from tf_amp.runtime.settings import (  # noqa: F401 - re-exported: the names users know
    ENV_ENABLE,
    ENV_GRAPH_REWRITE,
    ENV_LOSS_SCALING,
    ENV_VARS,
    Settings,
    loss_scaling_enabled_globally,
    rewrite_enabled_globally,
)

_LOG = logging.getLogger("tf_amp")

# Modules whose functions stay plain ``tf.function`` when the rewrite patches ``tf.function``.

_hook: PostImportHook | None = None
_patched_modules: set[str] = set()


def current() -> Settings | None:
    """The active settings, or None when not activated."""
    return _state.active_settings()


def activate_from_env(environ: Mapping[str, str] | None = None) -> Settings | None:
    """Activates what the environment asks for; None (and no patch) when nothing is asked."""
    requested = Settings.from_env(environ)
    if not requested.any:
        return None
    return activate(requested)


def activate(requested: Settings | None = None) -> Settings:
    """Applies the patches for ``requested`` (default: both halves). Re-activating replaces."""
    global _hook
    requested = requested or Settings(graph_rewrite=True, loss_scaling=True)
    with _state.LOCK:
        if _state.active_settings() is not None:
            deactivate()
        _state.set_active_settings(requested)
        _hook = PostImportHook(
            {"tensorflow": _patch_tensorflow, "tensorflow.compat.v1": _patch_imported_compat_v1,
             "keras": _patch_keras, "tf_keras": _patch_tf_keras},
            defer_inside="tf_amp.",
        )
        _hook.install()
        if "tensorflow" in sys.modules:
            _patch_tensorflow(sys.modules["tensorflow"])  # and a loaded tensorflow.compat.v1
        if "keras" in sys.modules:
            _patch_keras(sys.modules["keras"])
        if "tf_keras" in sys.modules:  # tf_keras hook (see _patch_tf_keras)
            _patch_tf_keras(sys.modules["tf_keras"])

    def word(half: bool | None) -> str:
        return "where the target needs it" if half is None else ("on" if half else "off")

    _LOG.info(
        "automatic mixed precision activated (graph rewrite: %s, loss scaling: %s)",
        word(requested.graph_rewrite),
        word(requested.loss_scaling),
    )
    return requested


def deactivate() -> None:
    """Restores every attribute the activation patched and removes the import hook."""
    global _hook
    with _state.LOCK:
        if _hook is not None:
            _hook.remove()
        _hook = None
        REGISTRY.release(ACTIVATION)
        _patched_modules.clear()
        _state.set_compile_optimizer_wrapper(None)
        if "tf_amp.runtime.auto_loss_scale" in sys.modules:  # its state exists only if loaded
            sys.modules["tf_amp.runtime.auto_loss_scale"].reset()
        if "tf_amp.runtime.tf_keras_env" in sys.modules:  # tf_keras hook
            sys.modules["tf_amp.runtime.tf_keras_env"].deactivate()
        _state.set_active_settings(None)


def is_active() -> bool:
    return _state.active_settings() is not None


def patch_count() -> int:
    """How many attributes the activation currently holds patched (0 when inactive)."""
    return REGISTRY.count(ACTIVATION)


@contextlib.contextmanager
def activated(requested: Settings | None = None) -> Iterator[Settings]:
    """Activation limited to a ``with`` block; restores the previous state on exit."""
    previous = _state.active_settings()
    active = activate(requested)
    try:
        yield active
    finally:
        deactivate()
        if previous is not None:
            activate(previous)


# --------------------------------------------------------------------------- the patches


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    REGISTRY.acquire(ACTIVATION, owner, name, make)


def _patch_tensorflow(tf: Any) -> None:
    with _state.LOCK:
        if _state.active_settings() is None or "tensorflow" in _patched_modules:
            return
        _patched_modules.add("tensorflow")
        active = settings.resolved_active()
        # On use (here and below): activation starts before TensorFlow is loaded.
        from tf_amp._upstream import tensorflow as upstream_tf

        if active.graph_rewrite:
            from tf_amp.runtime import session

            _patch(tf, "function", _make_function_patch)
            _patch(upstream_tf.session_manager, "session", session.SessionModuleShim)
        _patch_compat_v1(tf.compat.v1)
        if "tensorflow.compat.v1" in sys.modules:
            _patch_compat_v1(sys.modules["tensorflow.compat.v1"])
        if active.loss_scaling:
            from tf_amp.optimizers import _v1_saver
            from tf_amp.runtime import auto_loss_scale, auto_loss_scale_v1

            v1_optimizer = tf.compat.v1.train.Optimizer
            _patch(v1_optimizer, "minimize", auto_loss_scale_v1.v1_minimize_patch)
            _patch(v1_optimizer, "compute_gradients", _for_user_callers(
                auto_loss_scale_v1.v1_compute_gradients_patch))
            _patch(v1_optimizer, "apply_gradients", _for_user_callers(
                auto_loss_scale_v1.v1_apply_gradients_patch))
            _patch(v1_optimizer, "variables", auto_loss_scale_v1.v1_variables_patch)
            _patch(tf.GradientTape, "gradient", _for_user_callers(auto_loss_scale.gradient_patch))
            saver = tf.compat.v1.train.Saver
            _patch(saver, "build", _v1_saver.saver_build_patch)
            _patch(saver, "restore", _v1_saver.saver_restore_patch)
            # Registers the fused unscale op now (3 ms), not at its first use: a meta graph or
            # TF1 SavedModel that an earlier loss-scaled run wrote holds it, and importing one
            # before anything here ran failed ("Op type not registered").
            from tf_amp import ops

            ops.native_op_available()


def _patch_imported_compat_v1(module: Any) -> None:
    """The import hook's callback: the module the import ran, and the one it left in
    ``sys.modules`` (TensorFlow's module code puts a lazy-loading wrapper there)."""
    _patch_compat_v1(module)
    _patch_compat_v1(sys.modules.get("tensorflow.compat.v1", module))


def _patch_compat_v1(module: Any) -> None:
    """``Session``, ``InteractiveSession`` and ``disable_eager_execution`` of one
    ``tf.compat.v1`` module object.

    Two such objects exist once a script runs ``import tensorflow.compat.v1 as tf`` (what
    ``tf_upgrade_v2`` recommends): that import makes a second module, ``tensorflow.compat.v1``,
    with its own attributes, and rebinds ``tf.compat.v1`` to it. Patched on the first alone,
    such a script ran a plain Session: loss scaling without the rewrite, and nothing said.
    """
    with _state.LOCK:
        key = f"tensorflow.compat.v1 {id(module)}"
        if _state.active_settings() is None or key in _patched_modules:
            return
        _patched_modules.add(key)
        if settings.resolved_active().graph_rewrite:
            from tf_amp.runtime import session

            _patch(module, "Session", lambda _: session.Session)
            _patch(module, "InteractiveSession", lambda _: session.InteractiveSession)
        # The activation made the eager context above (its device query) before the script
        # could disable eager execution: TF1 scripts then need its eager entry gone.
        _patch(module, "disable_eager_execution", _disable_eager_execution_patch)


def _disable_eager_execution_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``tf.compat.v1.disable_eager_execution`` that leaves the context as it would be had
    nothing made it before (``_upstream.tensorflow.forget_eager_outer_context``)."""
    from tf_amp._upstream import tensorflow as upstream_tf

    def disable_eager_execution() -> None:
        original()
        upstream_tf.forget_eager_outer_context()

    disable_eager_execution.__wrapped__ = original  # type: ignore[attr-defined]
    disable_eager_execution.__doc__ = original.__doc__
    return disable_eager_execution


def _patch_keras(keras: Any) -> None:
    with _state.LOCK:
        if _state.active_settings() is None or "keras" in _patched_modules:
            return
        _patched_modules.add("keras")
        active = settings.resolved_active()
        if not (active.graph_rewrite or active.loss_scaling):
            return
        from tf_amp.runtime import keras_fit

        keras_fit.acquire_compile_patch(ACTIVATION)  # one patch, shared with enable_...
        if active.graph_rewrite:
            keras_fit.acquire_builder_hooks(ACTIVATION)  # an uncompiled model's predict too
        if active.loss_scaling:
            from tf_amp._upstream import keras as upstream_keras
            from tf_amp.optimizers import _scaled_losses
            from tf_amp.runtime import auto_loss_scale, auto_loss_scale_fit

            _state.set_compile_optimizer_wrapper(auto_loss_scale_fit.wrap_on_compile)
            _patch(keras.optimizers.Optimizer, "apply", auto_loss_scale.keras_apply_patch)
            # Keras's own scaling marks the loss it scales, so tape.gradient leaves it alone:
            # its wrapper's, and any optimizer's loss_scale_factor (tf_amp's wrappers mark
            # theirs themselves).
            _patch(keras.optimizers.LossScaleOptimizer, "scale_loss", _scaled_losses.marking_patch)
            _patch(keras.optimizers.Optimizer, "scale_loss", _scaled_losses.marking_patch)
            _patch(upstream_keras.legacy_h5_format, "save_model_to_hdf5",
                   auto_loss_scale_fit.h5_save_patch)


def _for_user_callers(
    make: Callable[[Any, Callable[[], bool]], Any],
) -> Callable[[Any], Any]:
    """A registry factory for a patch that acts only when user code calls it."""
    factory = _USER_CALLER_FACTORIES.get(make)
    if factory is None:
        factory = _USER_CALLER_FACTORIES[make] = lambda original: make(original, is_user_caller)
    return factory


_USER_CALLER_FACTORIES: dict[Any, Callable[[Any], Any]] = {}


def _patch_tf_keras(tf_keras: Any) -> None:
    """tf_keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``): its adapter holds its patches in the one
    registry under its own holder (released by ``deactivate`` through the adapter)."""
    del tf_keras  # the adapter asks tf_amp._upstream.tf_keras for what it patches
    with _state.LOCK:
        if _state.active_settings() is None or "tf_keras" in _patched_modules:
            return
        _patched_modules.add("tf_keras")
        active = settings.resolved_active()
        from tf_amp.runtime import tf_keras_env

        tf_keras_env.activate(
            graph_rewrite=bool(active.graph_rewrite), loss_scaling=bool(active.loss_scaling)
        )


def _make_function_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``tf.function`` that makes user functions run the rewrite.

    The result is still a genuine ``tf.function`` object (an ``AmpTfFunction``), so
    ``isinstance`` checks, methods and ``tf.saved_model.save`` keep working in unmodified code.
    """

    def function(func: Any = None, *args: Any, **kwargs: Any) -> Any:
        if func is None:
            return lambda f: function(f, *args, **kwargs)
        result = original(func, *args, **kwargs)
        if _is_library_object(func):
            return result
        # Imported at the first call, not when patching: the patch is made when TensorFlow
        # finishes loading, which may be inside ``import tf_amp.runtime.function`` itself.
        from tf_amp.runtime.function import as_amp_tf_function

        return as_amp_tf_function(result)

    function.__doc__ = original.__doc__
    function.__wrapped__ = original  # type: ignore[attr-defined]
    return function


def _is_library_object(func: Any) -> bool:
    module = getattr(func, "__module__", None) or ""
    return module.split(".")[0] in LIBRARY_MODULES
