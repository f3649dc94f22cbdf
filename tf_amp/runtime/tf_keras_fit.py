"""tf_keras (Keras 2) ``fit`` / ``evaluate`` / ``predict`` running the mixed-precision rewrite.

How: tf_keras's ``fit()`` calls ``model.make_train_function()`` and runs what it returns;
``compile()`` resets the cached function. The builders here let tf_keras build its own
function, unchanged (its loop over ``steps_per_execution``, its distribution, its
``jit_compile`` of the step, a custom ``train_step``), and then run that function's Python body
as a :class:`tf_amp.runtime.function.Function`: the same trace, rewritten, on the same variables.
No tf_keras loop is copied, so what ``fit`` does stays tf_keras's.

Which models: those whose optimizer asks for the rewrite (returned by
``tf_amp.enable_mixed_precision_graph_rewrite``, marked with ``_tf_amp_graph_rewrite``), and
every model while ``TF_ENABLE_AUTO_MIXED_PRECISION`` turned the rewrite on. The decision is
taken each time tf_keras builds a function, i.e. after every ``compile``: recompiling with a
plain optimizer returns the model to float32. ``evaluate`` and ``predict`` are rewritten too
(outputs keep their float32 dtype), as for Keras 3. ``run_eagerly=True`` has no graph to
rewrite: it runs float32 with one warning.

The builders are patched on ``tf_keras.Model`` by :func:`hook`, which the environment
activation and ``enable_...`` call with their own tag; the patches live in the one registry
(:mod:`tf_amp.runtime._patches`) under a tf_keras holder per switch, so the class attribute is
restored exactly when the last switch lets go (:func:`unhook`), in whatever order they come.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_amp.optimizers._settled import scale_for_a_float16_model
from tf_amp.runtime import _patches, _state, settings
from tf_amp.runtime.function import Function

_LOG = logging.getLogger("tf_amp")
_KINDS = {
    "make_train_function": "train_function",
    "make_test_function": "test_function",
    "make_predict_function": "predict_function",
}
_STEPS = "_tf_amp_steps"


def wants_rewrite(optimizer: Any) -> bool:
    """True for an optimizer marked by ``enable_...`` or while the environment turned the
    rewrite on for every model."""
    if any(_state.optimizer_wants_rewrite(o) for o in tf.nest.flatten(optimizer)):
        return True
    return settings.rewrite_enabled_globally()


def rewritten_functions(model: Any) -> dict[str, Function]:
    """The rewritten functions built for ``model`` so far, by kind (inspection and tests)."""
    return dict(model.__dict__.get(_STEPS, {}))


def _rewritten(model: Any, built: Any, kind: str) -> Any:
    """``built`` (what tf_keras's builder returned) as a rewritten :class:`Function`."""
    if not isinstance(built, tf.types.experimental.PolymorphicFunction):
        why = "runs eagerly (run_eagerly=True)" if model.run_eagerly else "has no tf.function"
        _LOG.warning(
            "model %r %s; there is no graph to rewrite, so its %s step runs in float32.",
            model.name,
            why,
            kind,
        )
        return built
    step = Function(built.python_function, reduce_retracing=True)
    model.__dict__.setdefault(_STEPS, {})[kind] = step
    return step


def builder_patch(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``Model.make_<kind>_function`` that rewrites the function tf_keras builds when the
    model's optimizer (or the environment) asks for it."""
    attr = _KINDS[name]
    kind = attr.split("_")[0]

    def make_function(self: Any, force: bool = False) -> Any:
        if not wants_rewrite(getattr(self, "optimizer", None)):
            return original(self, force)
        cached = getattr(self, attr, None)
        if cached is not None and not force:
            return cached
        scale_for_a_float16_model(self)
        function = _rewritten(self, original(self, True), kind)
        setattr(self, attr, function)
        return function

    make_function.__wrapped__ = original  # type: ignore[attr-defined]
    make_function.__doc__ = original.__doc__
    return make_function


# ----------------------------------------------------------------------------- patches


# The holders of tf_keras's patches in the one registry (tf_amp.runtime._patches), one per
# switch, apart from the Keras 3 holders so that each switch's own count stays its own.
HOLDERS: dict[str, str] = {
    "enable": f"{_patches.ENABLE} (tf_keras)",
    "env": f"{_patches.ACTIVATION} (tf_keras)",
}


def acquire(tag: str, owner: type, name: str, make: Callable[[Any], Any]) -> None:
    """Patches ``owner.name`` with ``make(original)`` for the switch ``tag`` (``"enable"`` or
    ``"env"``); shared with the other switch when it asks for the same attribute."""
    _patches.REGISTRY.acquire(HOLDERS[tag], owner, name, make)


def held(tag: str | None = None) -> int:
    """How many attributes tf_keras's patches hold (for ``tag``, or for either switch)."""
    installed = _patches.REGISTRY.installed().values()
    wanted = {HOLDERS[tag]} if tag else set(HOLDERS.values())
    return sum(1 for holders in installed if holders & wanted)


# One factory per builder, made once: the registry shares a patch between holders only when
# they bring the same factory.
_BUILDER_FACTORIES: dict[str, Callable[[Any], Any]] = {}


def _builder_factory(name: str) -> Callable[[Any], Any]:
    if name not in _BUILDER_FACTORIES:
        _BUILDER_FACTORIES[name] = functools.partial(builder_patch, name=name)
    return _BUILDER_FACTORIES[name]


def hook(tag: str) -> None:
    """Patches the three builders on ``tf_keras.Model`` for ``tag`` (idempotent)."""
    from tf_amp._upstream import tf_keras as upstream

    model = upstream.model_class()
    for name in _KINDS:
        acquire(tag, model, name, _builder_factory(name))


def unhook(tag: str) -> None:
    """Releases every patch ``tag`` holds (the builders, and the environment's others)."""
    _patches.REGISTRY.release(HOLDERS[tag])
