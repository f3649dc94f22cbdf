"""Keras 3 ``fit`` / ``evaluate`` / ``predict`` running the mixed-precision rewritten step.

How: ``fit()`` calls ``model.make_train_function()`` and then ``model.train_function(iterator)``
(DESIGN.md section 4), and ``compile()`` resets ``train_function``. We replace the *instance's*
``make_train_function`` (and the test / predict ones) with builders whose per-batch step is a
:class:`tf_amp.runtime.function.Function`; the loop over ``steps_per_execution`` batches stays a
plain ``tf.function`` around it, exactly as Keras builds it. Unchanged user code, unchanged
``fit()``; other models and the ``Model`` class are untouched.

Decision on ``evaluate`` and ``predict``: they run the rewritten graph too (``inference=True``,
the default). Validation then measures the model as it is actually trained and served in mixed
precision, and inference gets the same speed-up; outputs (metrics, predictions) keep their
float32 dtype because the rewrite never changes the dtype of a fetched output. Pass
``inference=False`` to keep them float32.

``jit_compile`` is honoured: the rewritten step is compiled with XLA when ``model.jit_compile``
is true (Keras's ``"auto"`` resolves to true for most TF models). ``run_eagerly=True`` cannot be
rewritten (there is no graph); it runs float32 with one warning.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import polymorphic_function as pf_lib

from tf_amp.runtime.function import Function

_LOG = logging.getLogger("tf_amp")
_MARK = "_tf_amp_keras_hook"
_BUILDERS = ("make_train_function", "make_test_function", "make_predict_function")
_FUNCTIONS = ("train_function", "test_function", "predict_function")


def install(model: Any, *, inference: bool = True, config: Any = None) -> None:
    """Makes ``model.fit`` (and, with ``inference``, evaluate/predict) run the rewritten step.

    Idempotent. Resets the model's cached functions so the next call builds rewritten ones.
    ``config`` is a ``tf_amp.RewriteConfig`` (default: from the environment).
    """
    model.make_train_function = types.MethodType(_builder("train", config), model)
    if inference:
        model.make_test_function = types.MethodType(_builder("test", config), model)
        model.make_predict_function = types.MethodType(_builder("predict", config), model)
    else:
        for name in _BUILDERS[1:]:
            model.__dict__.pop(name, None)
    _reset_functions(model)
    model.__dict__[_MARK] = {"inference": inference}


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
    return dict(model.__dict__.get("_tf_amp_steps", {}))


def _reset_functions(model: Any) -> None:
    for name in _FUNCTIONS:
        if hasattr(model, name):
            setattr(model, name, None)
    model.__dict__.pop("_tf_amp_steps", None)


def _builder(kind: str, config: Any):
    """A replacement for ``make_<kind>_function`` bound to the model instance."""
    attr = {"train": "train_function", "test": "test_function", "predict": "predict_function"}[kind]

    def make_function(self: Any, force: bool = False) -> Any:
        if getattr(self, attr) is not None and not force:
            return getattr(self, attr)
        step = {"train": self.train_step, "test": self.test_step, "predict": self.predict_step}[
            kind
        ]
        if kind == "predict":
            function = _make_predict_function(self, step, config)
        else:
            function = _make_step_function(self, step, kind, config)
        setattr(self, attr, function)
        return function

    return make_function


def _one_step(model: Any, step_function: Any, kind: str, config: Any) -> Any:
    """The per-batch step under the distribution strategy, rewritten unless run eagerly."""
    from keras.src.backend.tensorflow.trainer import reduce_per_replica

    reduction = "concat" if kind == "predict" else "auto"

    @tf.autograph.experimental.do_not_convert
    def one_step_on_data(data: Any) -> Any:
        if kind == "predict":
            data = data[0]
        outputs = model.distribute_strategy.run(step_function, args=(data,))
        return reduce_per_replica(outputs, model.distribute_strategy, reduction=reduction)

    if model.run_eagerly:
        _LOG.warning(
            "model %r runs eagerly (run_eagerly=True); there is no graph to rewrite, "
            "so its %s step runs in float32.",
            model.name,
            kind,
        )
        return one_step_on_data
    step = Function(
        one_step_on_data,
        rewrite_config=config,
        jit_compile=bool(model.jit_compile),
        reduce_retracing=True,
    )
    model.__dict__.setdefault("_tf_amp_steps", {})[kind] = step
    return _convert_optionals(step)


def _convert_optionals(step: Any) -> Any:
    """Keras passes empty ``tf.experimental.Optional`` for missing y / sample_weight."""
    from keras.src import tree

    def wrapper(data: Any) -> Any:
        data = tree.map_structure(
            lambda i: None if isinstance(i, tf.experimental.Optional) else i, data
        )
        return step(data)

    return wrapper


def _make_step_function(model: Any, step_function: Any, kind: str, config: Any) -> Any:
    """Mirrors Keras's ``TensorFlowTrainer._make_function`` with a rewritten per-batch step."""
    one_step_on_data = _one_step(model, step_function, kind, config)
    steps = int(model.steps_per_execution)

    @tf.autograph.experimental.do_not_convert
    def multi_step_on_iterator(iterator: Any) -> Any:
        if steps == 1:
            return tf.experimental.Optional.from_value(one_step_on_data(iterator.get_next()))
        # Run the first step outside the loop: it fixes the output structure (Optional spec)
        # the loop carries; then run the remaining steps while data lasts.
        # get_next() raises OutOfRangeError at the end of data, which fit() catches.
        outputs = one_step_on_data(iterator.get_next())
        flat = tf.nest.flatten(outputs)

        def cond(i: Any, *_: Any) -> Any:
            return tf.less(i, steps)

        def body(i: Any, *carried: Any) -> Any:
            nxt = iterator.get_next_as_optional()

            def run() -> Any:
                return tf.nest.flatten(one_step_on_data(nxt.get_value()))

            def stop() -> Any:
                return list(carried)

            new = tf.cond(nxt.has_value(), run, stop)
            i = tf.where(nxt.has_value(), i + 1, steps)
            return (i, *new)

        result = tf.while_loop(cond, body, (tf.constant(1), *flat))
        outputs = tf.nest.pack_sequence_as(outputs, list(result[1:]))
        return tf.experimental.Optional.from_value(outputs)

    if not model.run_eagerly:
        multi_step_on_iterator = pf_lib.function(multi_step_on_iterator, reduce_retracing=True)

    def function(iterator: Any) -> Any:
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            opt_outputs = multi_step_on_iterator(iterator)
            if not opt_outputs.has_value():
                raise StopIteration
            return opt_outputs.get_value()
        outputs = None
        for _, data in zip(range(steps), iterator, strict=False):
            outputs = one_step_on_data(data)
        return outputs

    return function


def _make_predict_function(model: Any, step_function: Any, config: Any) -> Any:
    """Mirrors Keras's ``make_predict_function`` with a rewritten per-batch step."""
    one_step_on_data = _one_step(model, step_function, "predict", config)

    @tf.autograph.experimental.do_not_convert
    def predict_function(data: Any) -> Any:
        outputs = one_step_on_data(data[:1])
        for single_step_data in data[1:]:
            step_outputs = one_step_on_data([single_step_data])
            outputs = tf.nest.map_structure(
                lambda t1, t2: tf.concat([t1, t2], axis=0), outputs, step_outputs
            )
        return outputs

    if not model.run_eagerly:
        predict_function = pf_lib.function(predict_function, reduce_retracing=True)
    return predict_function


# --- compile hook: installed by the environment activation (tf_amp.runtime.activation) and
# by install_compile_hook() for enable_mixed_precision_graph_rewrite.


def wants_rewrite(optimizer: Any) -> bool:
    """True when this optimizer asks for the graph rewrite, or the env activation turned it on.

    The process-wide flag of ``enable_mixed_precision_graph_rewrite`` is deliberately *not*
    consulted: the per-optimizer marker scopes the rewrite to the models compiled with that
    optimizer, so enabling it for one model does not leak into unrelated models.
    """
    from tf_amp.enable import optimizer_wants_rewrite

    if optimizer_wants_rewrite(optimizer):
        return True
    from tf_amp.runtime import activation

    return activation.rewrite_enabled_globally()


def _maybe_wrap_optimizer(model: Any, optimizer: Any) -> Any:
    """Under env loss scaling, a plain Keras optimizer gets a dynamic LossScaleOptimizer.

    Not for a model with its own ``train_step``: an unmodified float32 ``train_step`` never
    calls ``optimizer.scale_loss``, so a wrapper would divide true gradients by the scale.
    Such steps are loss-scaled by the ``GradientTape.gradient`` / ``apply`` patches instead
    (:mod:`tf_amp.runtime.auto_loss_scale`), which scale and unscale around the user's own
    ``tape.gradient`` call.
    """
    from tf_amp.runtime import activation

    if not activation.loss_scaling_enabled_globally() or _has_own_train_step(model):
        return optimizer
    import keras

    resolved = keras.optimizers.get(optimizer)
    if isinstance(resolved, keras.optimizers.LossScaleOptimizer):
        return resolved  # Keras's wrapper, or tf_amp's (a subclass of it): scaled already
    from tf_amp.optimizers import LossScaleOptimizer, _common
    from tf_amp.runtime.auto_loss_scale import STATE_NAME

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
        optimizer = getattr(model, "optimizer", None)
        if not getattr(optimizer, "saves_as_inner", False):
            return original(model, *args, **kwargs)
        object.__setattr__(model, "optimizer", optimizer.inner_optimizer)  # no re-tracking
        try:
            return original(model, *args, **kwargs)
        finally:
            object.__setattr__(model, "optimizer", optimizer)

    save_model_to_hdf5.__wrapped__ = original  # type: ignore[attr-defined]
    return save_model_to_hdf5


def _has_own_train_step(model: Any) -> bool:
    module = getattr(type(model).train_step, "__module__", "") or ""
    return module.split(".")[0] not in ("keras", "tf_keras")


def compile_patch(original: Any) -> Any:
    """``Model.compile`` that hooks ``fit`` when the optimizer (or the env) asks for the rewrite.

    Inert for every other model: it calls the original and uninstalls any earlier hook, so
    recompiling with a plain optimizer returns the model to float32. A hooked model also gets
    an instance ``compile`` (:func:`_recompile`) that drops the hook first, so this holds after
    the patch itself was removed (``disable_...``, deactivation).
    """

    def compile(self: Any, optimizer: Any = "rmsprop", *args: Any, **kwargs: Any) -> Any:
        wrapped = _maybe_wrap_optimizer(self, optimizer)
        result = original(self, wrapped, *args, **kwargs)
        if getattr(wrapped, "saves_as_inner", False):
            # The compile config a .keras file stores names the script's optimizer, not the
            # wrapper: the file loads without tf_amp, and under the activation it is wrapped
            # again on load.
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


_ORIGINAL_COMPILE: list[Any] = []


def compile_owner() -> type:
    """The class that defines ``compile`` (Keras's ``Trainer``), which is the one to patch.

    Why not ``keras.Model``: ``compile_from_config`` (run by ``load_model``) treats a model as
    having a custom ``compile`` when ``type(model).compile != Trainer.compile`` and then skips
    compiling, so a ``.keras`` file would load without its optimizer while a patch sat on
    ``keras.Model``. Patched on ``Trainer``, every model still resolves to the patch.
    """
    from keras.src.trainers.trainer import Trainer

    return Trainer


def install_compile_hook() -> None:
    """Patches ``compile`` of every Keras model with :func:`compile_patch` (idempotent,
    reversible).

    This is what connects ``enable_mixed_precision_graph_rewrite(opt)`` to ``model.fit``.
    """
    if _ORIGINAL_COMPILE:
        return
    owner = compile_owner()
    _ORIGINAL_COMPILE.append(vars(owner)["compile"])
    owner.compile = compile_patch(owner.compile)
    # ``model.compile(optimizer=tf_amp.enable_...(opt))`` in one statement looks up
    # ``model.compile`` before the argument runs enable_, so that first compile is Keras's own.
    # The builders catch such a model at its first fit / evaluate / predict instead.
    builders = _builder_owner()
    for name in _BUILDERS:
        original = vars(builders)[name]
        _ORIGINAL_BUILDERS[name] = original
        setattr(builders, name, _late_hook(name, original))


def _builder_owner() -> type:
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer


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


_ORIGINAL_BUILDERS: dict[str, Any] = {}


def uninstall_compile_hook() -> None:
    """Restores ``compile`` and the builders; already hooked models keep their hook until
    recompiled."""
    if not _ORIGINAL_COMPILE:
        return
    compile_owner().compile = _ORIGINAL_COMPILE.pop()
    builders = _builder_owner()
    for name, original in _ORIGINAL_BUILDERS.items():
        setattr(builders, name, original)
    _ORIGINAL_BUILDERS.clear()
