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
activation and ``enable_...`` call with their own tag; the class attribute is restored exactly
when the last tag is released (:func:`unhook`), in whatever order they come.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

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
    from tf_amp.enable import optimizer_wants_rewrite

    if any(optimizer_wants_rewrite(o) for o in tf.nest.flatten(optimizer)):
        return True
    from tf_amp.runtime import activation

    return activation.rewrite_enabled_globally()


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
        function = _rewritten(self, original(self, True), kind)
        setattr(self, attr, function)
        return function

    make_function.__wrapped__ = original  # type: ignore[attr-defined]
    make_function.__doc__ = original.__doc__
    return make_function


# ----------------------------------------------------------------------------- patches


class TaggedPatches:
    """Class attributes patched on behalf of one or more tags (``"enable"``, ``"env"``).

    A patch is installed by the first tag that asks for it and the original restored when the
    last tag holding it lets go, so ``enable_...`` and the environment activation can come and
    go in any order without one undoing the other's patch.
    """

    def __init__(self) -> None:
        self._originals: dict[tuple[type, str], Any] = {}
        self._tags: dict[tuple[type, str], set[str]] = {}
        self._lock = threading.Lock()

    def set(
        self, tag: str, owner: type, name: str, make: Callable[[Any], Any]
    ) -> None:
        key = (owner, name)
        with self._lock:
            if key not in self._originals:
                original = vars(owner)[name]
                self._originals[key] = original
                setattr(owner, name, make(original))
            self._tags.setdefault(key, set()).add(tag)

    def release(self, tag: str) -> None:
        with self._lock:
            for key in list(self._tags):
                self._tags[key].discard(tag)
                if not self._tags[key]:
                    owner, name = key
                    setattr(owner, name, self._originals.pop(key))
                    del self._tags[key]

    def held(self, tag: str | None = None) -> int:
        """How many attributes are patched (for ``tag``, or for any tag)."""
        return sum(1 for tags in self._tags.values() if tag is None or tag in tags)


PATCHES = TaggedPatches()


def hook(tag: str) -> None:
    """Patches the three builders on ``tf_keras.Model`` for ``tag`` (idempotent)."""
    from tf_amp._upstream import tf_keras as upstream

    model = upstream.model_class()
    for name in _KINDS:
        PATCHES.set(tag, model, name, lambda original, name=name: builder_patch(original, name))


def unhook(tag: str) -> None:
    """Releases every patch ``tag`` holds (the builders, and the environment's others)."""
    PATCHES.release(tag)
