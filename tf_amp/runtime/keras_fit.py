"""Keras 3 ``fit`` / ``evaluate`` / ``predict`` running the mixed-precision rewritten step.

Per model, :func:`install` replaces the *instance's* ``make_train_function`` (and the test /
predict ones) with builders of rewritten steps (:mod:`tf_amp.runtime.keras_steps`). Unchanged
user code, unchanged ``fit()``; other models and the ``Model`` class are untouched.

Which models: the compile hook (:func:`compile_patch`, on Keras's ``Trainer.compile``) installs
it on every model compiled with an optimizer that asks for the rewrite (the mark
``enable_mixed_precision_graph_rewrite`` sets), or on every model while the environment
activation has the rewrite on. Both switches hold that one patch through the patch registry
(:mod:`tf_amp.runtime._patches`), so it stays while either needs it.

Decision on ``evaluate`` and ``predict``: they run the rewritten graph too (``inference=True``,
the default). Validation then measures the model as it is actually trained and served in mixed
precision, and inference gets the same speed-up; outputs (metrics, predictions) keep their
float32 dtype because the rewrite never changes the dtype of a fetched output. Pass
``inference=False`` to keep them float32.

This module knows nothing about loss scaling: under the environment's loss scaling, the
optimizer a script passes to ``compile`` is wrapped by the function the activation registers
(:func:`tf_amp.runtime._state.compile_optimizer_wrapper`).
"""

from __future__ import annotations

import types
from typing import Any

from tf_amp._upstream import keras as upstream_keras
from tf_amp.optimizers._settled import scale_for_a_float16_model
from tf_amp.runtime import _patches, _state, keras_steps, settings
from tf_amp.runtime.function import Function

_MARK = "_tf_amp_keras_hook"
_BUILDERS = ("make_train_function", "make_test_function", "make_predict_function")


# --------------------------------------------------------------------------- one model


def install(model: Any, *, inference: bool = True, config: Any = None) -> None:
    """Makes ``model.fit`` (and, with ``inference``, evaluate/predict) run the rewritten step.

    Idempotent. Resets the model's cached functions so the next call builds rewritten ones.
    ``config`` is a ``tf_amp.RewriteConfig`` (default: from the environment).
    """
    model.make_train_function = types.MethodType(keras_steps.builder("train", config), model)
    if inference:
        model.make_test_function = types.MethodType(keras_steps.builder("test", config), model)
        model.make_predict_function = types.MethodType(
            keras_steps.builder("predict", config), model
        )
    else:
        for name in _BUILDERS[1:]:
            model.__dict__.pop(name, None)
    _reset_functions(model)
    model.__dict__[_MARK] = {"inference": inference}
    scale_for_a_float16_model(model)



def uninstall(model: Any) -> None:
    """Undoes :func:`install`: the model's own Keras builders are used again."""
    if _MARK not in model.__dict__:
        return
    for name in _BUILDERS:
        model.__dict__.pop(name, None)
    if getattr(model.__dict__.get("compile"), "__func__", None) is _recompile:
        del model.__dict__["compile"]
    model.__dict__.pop(_MARK, None)
    _reset_functions(model)


def is_installed(model: Any) -> bool:
    """True when ``model``'s fit runs the rewritten step."""
    return _MARK in getattr(model, "__dict__", {})


def rewritten_functions(model: Any) -> dict[str, Function]:
    """The per-batch rewritten step functions built so far, by kind (for inspection and tests)."""
    return dict(model.__dict__.get(keras_steps.STEPS_ATTR, {}))


def _reset_functions(model: Any) -> None:
    for name in keras_steps.FUNCTION_ATTRS.values():
        if hasattr(model, name):
            setattr(model, name, None)
    model.__dict__.pop(keras_steps.STEPS_ATTR, None)


# --------------------------------------------------------------------------- compile hook


def wants_rewrite(optimizer: Any) -> bool:
    """True when this optimizer asks for the graph rewrite, or the env activation turned it on.

    The process-wide flag of ``enable_mixed_precision_graph_rewrite`` is deliberately *not*
    consulted: the per-optimizer marker scopes the rewrite to the models compiled with that
    optimizer, so enabling it for one model does not leak into unrelated models.
    """
    return _state.optimizer_wants_rewrite(optimizer) or settings.rewrite_enabled_globally()


def compile_patch(original: Any) -> Any:
    """``Model.compile`` that hooks ``fit`` when the optimizer (or the env) asks for the rewrite.

    Inert for every other model: it calls the original and uninstalls any earlier hook, so
    recompiling with a plain optimizer returns the model to float32. A hooked model also gets
    an instance ``compile`` (:func:`_recompile`) that drops the hook first, so this holds after
    the patch itself was removed (``disable_...``, deactivation).
    """

    def compile(self: Any, optimizer: Any = "rmsprop", *args: Any, **kwargs: Any) -> Any:
        wrap = _state.compile_optimizer_wrapper()
        wrapped = optimizer if wrap is None else wrap(self, optimizer)
        result = original(self, wrapped, *args, **kwargs)
        if getattr(wrapped, "saves_as_inner", False):
            # The compile config a .keras file stores names the script's optimizer, not the
            # wrapper the environment put around it: the file loads without tf_amp, and under
            # the activation it is wrapped again on load.
            compile_config = getattr(self, "_compile_config", None)
            if compile_config is not None and "optimizer" in compile_config.config:
                compile_config.config["optimizer"] = wrapped.inner_optimizer
        if wants_rewrite(getattr(self, "optimizer", optimizer)):
            install(self)
            # This patch may be gone at the next compile (disable_... / deactivation restore
            # the original): the model's own compile then drops the hook first.
            self.__dict__["compile"] = types.MethodType(_recompile, self)
        else:
            uninstall(self)
        return result

    compile.__wrapped__ = original  # type: ignore[attr-defined]
    compile.__doc__ = original.__doc__
    return compile


def _recompile(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Instance ``compile`` of a model the compile patch hooked: every recompile starts from
    float32. Through the class's ``compile``: the patch, while installed, hooks the model again
    if the new optimizer (or the env) asks for it; the restored original leaves it float32."""
    uninstall(self)
    return type(self).compile(self, *args, **kwargs)


def compile_owner() -> type:
    """The class that defines ``compile`` (Keras's ``Trainer``: see ``tf_amp._upstream.keras``
    for why not ``keras.Model``)."""
    return upstream_keras.Trainer


def _late_hook(name: str, original: Any) -> Any:
    """A class-level builder that hooks a model compiled with a marked optimizer before the
    compile hook existed, then defers to the model's (now hooked) builder."""

    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_installed(self) and wants_rewrite(getattr(self, "optimizer", None)):
            install(self)
            self.__dict__["compile"] = types.MethodType(_recompile, self)
            return getattr(self, name)(*args, **kwargs)
        return original(self, *args, **kwargs)

    build.__wrapped__ = original  # type: ignore[attr-defined]
    return build


# One factory per builder, made once: the registry tells replacements apart by their factory.
_LATE_HOOKS = {
    name: (lambda original, name=name: _late_hook(name, original)) for name in _BUILDERS
}


def acquire_compile_patch(holder: str) -> None:
    """Installs (or joins) the ``compile`` patch for ``holder`` (a registry holder name)."""
    _patches.REGISTRY.acquire(holder, compile_owner(), "compile", compile_patch)


def install_compile_hook() -> None:
    """Patches ``compile`` of every Keras model with :func:`compile_patch`, and the three step
    builders with a late hook; held for ``enable_mixed_precision_graph_rewrite`` (idempotent,
    reversible with :func:`uninstall_compile_hook`).

    The builders: ``model.compile(optimizer=tf_amp.enable_...(opt))`` in one statement looks up
    ``model.compile`` before the argument runs ``enable_``, so that first compile is Keras's
    own; the builders catch such a model at its first fit / evaluate / predict instead.
    """
    holder = _patches.ENABLE
    acquire_compile_patch(holder)
    acquire_builder_hooks(holder)


def acquire_builder_hooks(holder: str) -> None:
    """Installs (or joins) the late hook of the three step builders for ``holder``.

    The environment activation holds them too: a model it never saw compiled (built or loaded
    for inference only) ran ``predict`` and ``evaluate`` float32, in silence.
    """
    owner = upstream_keras.TensorFlowTrainer
    for name in _BUILDERS:
        _patches.REGISTRY.acquire(holder, owner, name, _LATE_HOOKS[name])


def uninstall_compile_hook() -> None:
    """Releases what :func:`install_compile_hook` installed (``compile`` stays while the
    environment activation holds it); already hooked models keep their hook until
    recompiled."""
    _patches.REGISTRY.release(_patches.ENABLE)
