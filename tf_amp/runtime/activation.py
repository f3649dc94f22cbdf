"""``TF_ENABLE_AUTO_MIXED_PRECISION``: the environment switch, its patches, and their reversal.

The NVIDIA container promise: set ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` and an unmodified script
trains in mixed precision with dynamic loss scaling. TensorFlow 2 silently ignores the variable;
with tf_amp installed, its startup hook (``tf_amp_autoenable.pth`` ->
:mod:`tf_amp.runtime.autoenable`) calls :func:`activate_from_env` when the variable is set.

Variables (read here and nowhere else; each value is 1/0, true/false, yes/no or on/off)::

    TF_ENABLE_AUTO_MIXED_PRECISION               both halves below (default for each of them)
    TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE  the graph rewrite only (overrides the above)
    TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING   dynamic loss scaling only (overrides the above)

The target decides what ``TF_ENABLE_AUTO_MIXED_PRECISION=1`` alone turns on (resolved once, when
TensorFlow is imported, by :func:`tf_amp.config.process_target`, and said once in the log):
float16 gets the rewrite and dynamic loss scaling; bfloat16 the rewrite only (float32's exponent
range: nothing underflows); float32 (a CPU without fast reduced precision) nothing at all, so an
unmodified script runs exactly as without tf_amp. The two specific variables still force their
half on or off whatever the target.

What activation patches (every patch is recorded and :func:`deactivate` restores the original
attribute exactly; modules not yet imported are patched right after their import, so activation
at startup does not import TensorFlow):

* graph rewrite: ``tf.function`` returns ``tf_amp.function`` for user functions (functions
  defined in TensorFlow's or Keras's own modules keep the original); ``tf.compat.v1.Session`` is
  ``tf_amp.Session`` and ``tf.compat.v1.InteractiveSession`` its interactive form;
  ``MonitoredSession`` / ``MonitoredTrainingSession`` / ``Supervisor`` get ``tf_amp.Session``
  from ``SessionManager`` (its module reference to ``session`` is patched);
  ``keras.Model.compile`` installs the rewritten ``fit``/``evaluate``/``predict`` step
  (:mod:`tf_amp.runtime.keras_fit`).
* loss scaling: ``keras.Model.compile`` wraps the optimizer in ``tf_amp.LossScaleOptimizer``;
  ``tf.compat.v1.train.Optimizer.minimize`` goes through a (cached) ``LossScaleOptimizer`` of the
  optimizer, and so do ``compute_gradients`` / ``apply_gradients`` called by user code (the
  wrapper's unscaled gradients; its skip-on-overflow apply); in custom loops,
  ``tf.GradientTape.gradient`` called from user code scales the loss and the next Keras
  ``optimizer.apply`` / ``apply_gradients`` skips the step on overflow
  (:mod:`tf_amp.runtime.auto_loss_scale`).

tf_keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``): once tf_keras is imported, the same halves are
applied to it by :mod:`tf_amp.runtime.tf_keras_env` (its builders, ``compile`` and optimizers'
``apply_gradients``), held in that module's registry and released by :func:`deactivate`.

Scoping: nothing changes unless activated; :func:`activated` is a context manager for tests and
for turning it on around one region of a program.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tf_amp._flags import parse_flag

_LOG = logging.getLogger("tf_amp")

ENV_ENABLE = "TF_ENABLE_AUTO_MIXED_PRECISION"
ENV_GRAPH_REWRITE = "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE"
ENV_LOSS_SCALING = "TF_ENABLE_AUTO_MIXED_PRECISION_LOSS_SCALING"
ENV_VARS = (ENV_ENABLE, ENV_GRAPH_REWRITE, ENV_LOSS_SCALING)

# Modules whose functions stay plain ``tf.function`` when the rewrite patches ``tf.function``.
_LIBRARY_MODULES = frozenset({"tensorflow", "keras", "tf_keras", "tf_amp", "absl", "tensorboard"})


@dataclass(frozen=True)
class Settings:
    """Which halves of automatic mixed precision the environment asks for.

    ``None`` for a half means "where the target needs it" (only ``TF_ENABLE_AUTO_MIXED_PRECISION``
    was set); :meth:`for_target` turns it into a yes or no.
    """

    graph_rewrite: bool | None = False
    loss_scaling: bool | None = False

    @property
    def any(self) -> bool:
        return self.graph_rewrite is not False or self.loss_scaling is not False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Reads the three variables; raises ValueError naming a variable it cannot parse."""
        env = os.environ if environ is None else environ
        enable = parse_flag(env, ENV_ENABLE)
        rewrite = parse_flag(env, ENV_GRAPH_REWRITE)
        scaling = parse_flag(env, ENV_LOSS_SCALING)
        default = None if enable else False
        return cls(
            graph_rewrite=default if rewrite is None else rewrite,
            loss_scaling=default if scaling is None else scaling,
        )

    def for_target(self, target: Any) -> Settings:
        """Settings with every "where needed" half decided for ``target`` (a TargetChoice)."""
        return Settings(
            graph_rewrite=target.rewrites if self.graph_rewrite is None else self.graph_rewrite,
            loss_scaling=(
                target.needs_loss_scaling if self.loss_scaling is None else self.loss_scaling
            ),
        )



# --------------------------------------------------------------------------- patch registry


class _Patches:
    """Records (owner, attribute, original) so deactivation restores exactly what was there."""

    def __init__(self) -> None:
        self._entries: list[tuple[Any, str, Any, bool]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        had = name in vars(owner) if isinstance(owner, type) else hasattr(owner, name)
        original = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        self._entries.append((owner, name, original, had))
        setattr(owner, name, value)

    def restore_all(self) -> None:
        while self._entries:
            owner, name, original, had = self._entries.pop()
            if had:
                setattr(owner, name, original)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)

    def __len__(self) -> int:
        return len(self._entries)


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Runs a callback right after a module finishes importing (so startup imports nothing)."""

    def __init__(self, callbacks: dict[str, Callable[[Any], None]]) -> None:
        self._callbacks = callbacks
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        callback = self._callbacks.get(fullname)
        if callback is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            loader_exec(module)
            if self in sys.meta_path:  # still active
                callback(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_LOCK = threading.RLock()
_ACTIVE: Settings | None = None
_PATCHES = _Patches()
_HOOK: _PostImportHook | None = None
_PATCHED_MODULES: set[str] = set()


def current() -> Settings | None:
    """The active settings, or None when not activated."""
    return _ACTIVE


def rewrite_enabled_globally() -> bool:
    """True when the environment activation turned the graph rewrite on for every model."""
    with _LOCK:
        return _ACTIVE is not None and bool(_resolve_active().graph_rewrite)


def loss_scaling_enabled_globally() -> bool:
    with _LOCK:
        return _ACTIVE is not None and bool(_resolve_active().loss_scaling)


def activate_from_env(environ: Mapping[str, str] | None = None) -> Settings | None:
    """Activates what the environment asks for; None (and no patch) when nothing is asked."""
    settings = Settings.from_env(environ)
    if not settings.any:
        return None
    return activate(settings)


def activate(settings: Settings | None = None) -> Settings:
    """Applies the patches for ``settings`` (default: both halves). Re-activating replaces."""
    global _ACTIVE, _HOOK
    settings = settings or Settings(graph_rewrite=True, loss_scaling=True)
    with _LOCK:
        if _ACTIVE is not None:
            deactivate()
        _ACTIVE = settings
        _HOOK = _PostImportHook(
            {"tensorflow": _patch_tensorflow, "keras": _patch_keras, "tf_keras": _patch_tf_keras}
        )
        sys.meta_path.insert(0, _HOOK)
        if "tensorflow" in sys.modules:
            _patch_tensorflow(sys.modules["tensorflow"])
        if "keras" in sys.modules:
            _patch_keras(sys.modules["keras"])
        if "tf_keras" in sys.modules:  # tf_keras hook (see _patch_tf_keras)
            _patch_tf_keras(sys.modules["tf_keras"])
    def word(half: bool | None) -> str:
        return "where the target needs it" if half is None else ("on" if half else "off")

    _LOG.info(
        "automatic mixed precision activated (graph rewrite: %s, loss scaling: %s)",
        word(settings.graph_rewrite),
        word(settings.loss_scaling),
    )
    return settings


def deactivate() -> None:
    """Restores every patched attribute and removes the import hook."""
    global _ACTIVE, _HOOK
    with _LOCK:
        if _HOOK is not None and _HOOK in sys.meta_path:
            sys.meta_path.remove(_HOOK)
        _HOOK = None
        _PATCHES.restore_all()
        _PATCHED_MODULES.clear()
        if "tf_amp.runtime.auto_loss_scale" in sys.modules:
            sys.modules["tf_amp.runtime.auto_loss_scale"].reset()
        if "tf_amp.runtime.tf_keras_env" in sys.modules:  # tf_keras hook
            sys.modules["tf_amp.runtime.tf_keras_env"].deactivate()
        _ACTIVE = None


def is_active() -> bool:
    return _ACTIVE is not None


def patch_count() -> int:
    """How many attributes are currently patched (0 when inactive)."""
    return len(_PATCHES)


@contextlib.contextmanager
def activated(settings: Settings | None = None) -> Iterator[Settings]:
    """Activation limited to a ``with`` block; restores the previous state on exit."""
    previous = _ACTIVE
    active = activate(settings)
    try:
        yield active
    finally:
        deactivate()
        if previous is not None:
            activate(previous)


# --------------------------------------------------------------------------- the patches


def _resolve_active() -> Settings:
    """Decides the "where needed" halves of the active settings (once, when TensorFlow is
    loaded, or at the first question about them) and says what was decided and why. Called
    with ``_LOCK`` held."""
    global _ACTIVE
    assert _ACTIVE is not None
    if _ACTIVE.graph_rewrite is not None and _ACTIVE.loss_scaling is not None:
        return _ACTIVE
    from tf_amp.config import process_target

    target = process_target(announce=False)
    _ACTIVE = _ACTIVE.for_target(target)
    _LOG.info(
        "automatic mixed precision for target %s: graph rewrite: %s, loss scaling: %s (%s)",
        target.dtype,
        "on" if _ACTIVE.graph_rewrite else "off",
        "on" if _ACTIVE.loss_scaling else "off",
        target.reason,
    )
    return _ACTIVE


def _patch_tensorflow(tf: Any) -> None:
    with _LOCK:
        if _ACTIVE is None or "tensorflow" in _PATCHED_MODULES:
            return
        _PATCHED_MODULES.add("tensorflow")
        settings = _resolve_active()
        if settings.graph_rewrite:
            from tensorflow.python.training import session_manager

            from tf_amp.runtime.session import InteractiveSession, Session, SessionModuleShim

            _PATCHES.set(tf, "function", _make_function_patch(tf.function))
            _PATCHES.set(tf.compat.v1, "Session", Session)
            _PATCHES.set(tf.compat.v1, "InteractiveSession", InteractiveSession)
            _PATCHES.set(session_manager, "session", SessionModuleShim(session_manager.session))
        if settings.loss_scaling:
            from tf_amp.runtime import auto_loss_scale

            v1_optimizer = tf.compat.v1.train.Optimizer
            _PATCHES.set(
                v1_optimizer, "minimize", auto_loss_scale.v1_minimize_patch(v1_optimizer.minimize)
            )
            _PATCHES.set(
                v1_optimizer,
                "compute_gradients",
                auto_loss_scale.v1_compute_gradients_patch(
                    v1_optimizer.compute_gradients, _is_user_caller
                ),
            )
            _PATCHES.set(
                v1_optimizer,
                "apply_gradients",
                auto_loss_scale.v1_apply_gradients_patch(
                    v1_optimizer.apply_gradients, _is_user_caller
                ),
            )
            _PATCHES.set(
                tf.GradientTape,
                "gradient",
                auto_loss_scale.gradient_patch(tf.GradientTape.gradient, _is_user_caller),
            )
            saver = tf.compat.v1.train.Saver
            _PATCHES.set(saver, "__init__", auto_loss_scale.saver_init_patch(saver.__init__))
            _PATCHES.set(saver, "restore", auto_loss_scale.saver_restore_patch(saver.restore))


def _patch_keras(keras: Any) -> None:
    with _LOCK:
        if _ACTIVE is None or "keras" in _PATCHED_MODULES:
            return
        _PATCHED_MODULES.add("keras")
        settings = _resolve_active()
        if not (settings.graph_rewrite or settings.loss_scaling):
            return
        from tf_amp.runtime import keras_fit

        owner = keras_fit.compile_owner()  # Keras's Trainer: see compile_owner for why
        _PATCHES.set(owner, "compile", keras_fit.compile_patch(owner.compile))
        if settings.loss_scaling:
            from keras.src.optimizers import base_optimizer

            from tf_amp.runtime import auto_loss_scale

            base = base_optimizer.BaseOptimizer
            _PATCHES.set(base, "apply", auto_loss_scale.keras_apply_patch(base.apply))
            from keras.src.legacy.saving import legacy_h5_format

            save_h5 = legacy_h5_format.save_model_to_hdf5
            _PATCHES.set(legacy_h5_format, "save_model_to_hdf5", keras_fit.h5_save_patch(save_h5))


# --- tf_keras hook: tf_keras (Keras 2, TF_USE_LEGACY_KERAS=1) gets its own patches, held in
# runtime/tf_keras_env.py's registry (released by deactivate above).
def _patch_tf_keras(tf_keras: Any) -> None:
    del tf_keras  # the adapter asks tf_amp._upstream.tf_keras for what it patches
    with _LOCK:
        if _ACTIVE is None or "tf_keras" in _PATCHED_MODULES:
            return
        _PATCHED_MODULES.add("tf_keras")
        settings = _resolve_active()
        from tf_amp.runtime import tf_keras_env

        tf_keras_env.activate(
            graph_rewrite=bool(settings.graph_rewrite), loss_scaling=bool(settings.loss_scaling)
        )
# --- end of the tf_keras hook


def _make_function_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``tf.function`` that makes user functions run the rewrite.

    The result is still a genuine ``tf.function`` object (an ``AmpTfFunction``), so
    ``isinstance`` checks, methods and ``tf.saved_model.save`` keep working in unmodified code.
    """
    from tf_amp.runtime.function import as_amp_tf_function

    def function(func: Any = None, *args: Any, **kwargs: Any) -> Any:
        if func is None:
            return lambda f: function(f, *args, **kwargs)
        result = original(func, *args, **kwargs)
        if _is_library_object(func):
            return result
        return as_amp_tf_function(result)

    function.__doc__ = original.__doc__
    function.__wrapped__ = original  # type: ignore[attr-defined]
    return function


def _is_library_object(func: Any) -> bool:
    module = getattr(func, "__module__", None) or ""
    return module.split(".")[0] in _LIBRARY_MODULES


def _is_user_caller(depth: int = 2) -> bool:
    """True when the code calling (``depth`` frames up) is user code, not TF/Keras/tf_amp.

    AutoGraph routes calls inside a converted function through its own ``converted_call``;
    those frames are skipped so the user's converted function is the one that decides.
    """
    frame = sys._getframe(depth)  # noqa: SLF001
    while frame is not None:
        module = frame.f_globals.get("__name__", "") or ""
        if not module.startswith("tensorflow.python.autograph"):
            return module.split(".")[0] not in _LIBRARY_MODULES
        frame = frame.f_back
    return False
