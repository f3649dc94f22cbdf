"""The rewritten ``fit`` / ``evaluate`` / ``predict`` steps of one Keras 3 model.

How: ``fit()`` calls ``model.make_train_function()`` and then ``model.train_function(iterator)``,
and ``compile()`` resets ``train_function``. :func:`builder` makes replacements for the
*instance's* ``make_train_function`` (and the test / predict ones) whose per-batch step is a
:class:`tf_amp.runtime.function.Function`; the loop over ``steps_per_execution`` batches stays a
plain ``tf.function`` around it, as Keras builds it (why the loop is built here rather than by
Keras's own ``make_train_function``: see :mod:`tf_amp._upstream.keras`).

``jit_compile`` is honoured: the rewritten step is compiled with XLA when ``model.jit_compile``
is true, where Keras compiles it (around ``strategy.run`` for train and test, the step each
replica runs for predict). ``run_eagerly=True`` cannot be rewritten (there is no graph); it
runs float32 with one warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tf_amp._upstream import keras as upstream_keras
from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp.runtime.function import Function

_LOG = logging.getLogger("tf_amp")

STEPS_ATTR = "_tf_amp_steps"
"""Instance attribute holding the per-batch rewritten step functions built so far, by kind."""

FUNCTION_ATTRS = {"train": "train_function", "test": "test_function", "predict": "predict_function"}
"""Where Keras caches each kind's built function on the model."""


def builder(kind: str, config: Any) -> Callable[..., Any]:
    """A replacement for ``make_<kind>_function``, to be bound to one model instance.

    ``config`` is a ``tf_amp.RewriteConfig`` (None: from the environment at trace time).
    """
    attr = FUNCTION_ATTRS[kind]

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
    reduction = "concat" if kind == "predict" else "auto"
    jit_compile = bool(model.jit_compile)
    if kind == "predict" and jit_compile and not model.run_eagerly:
        # As Keras builds it: XLA compiles the step each replica runs, inside
        # ``strategy.run``. Compiled around it, a MirroredStrategy's replicas failed ("TF
        # variable on a different device"). The rewrite reaches the compiled step: a
        # ``jit_compile`` callee stays in the function library, where it is rewritten.
        compiled = upstream_tf.tf_function(step_function, reduce_retracing=True, jit_compile=True)

        def per_replica_step(data: Any) -> Any:
            # A plain callable, as Keras's is: ``strategy.run`` would lift a tf.function
            # around every replica at once, one XLA computation on one device (same error).
            return compiled(data)

        step_function, jit_compile = per_replica_step, None

    @tf.autograph.experimental.do_not_convert
    def one_step_on_data(data: Any) -> Any:
        if kind == "predict":
            data = data[0]
        outputs = model.distribute_strategy.run(step_function, args=(data,))
        return upstream_keras.reduce_per_replica(
            outputs, model.distribute_strategy, reduction=reduction
        )

    # The traced graph's name, which the log lines and the log files give: the three kinds
    # were all "one_step_on_data" (Keras's name), so a log told them apart by order alone.
    one_step_on_data.__name__ = f"one_{kind}_step_on_data"

    if model.run_eagerly:
        _LOG.warning(
            "model %r runs eagerly (run_eagerly=True); there is no graph to rewrite, "
            "so its %s step runs in float32.",
            model.name,
            kind,
        )
        return _convert_optionals(one_step_on_data)  # as Keras converts them, eager or not
    step = Function(
        one_step_on_data,
        rewrite_config=config,
        jit_compile=jit_compile,
        reduce_retracing=True,
    )
    model.__dict__.setdefault(STEPS_ATTR, {})[kind] = step
    return _convert_optionals(step)


def _convert_optionals(step: Any) -> Any:
    """Keras passes empty ``tf.experimental.Optional`` for missing y / sample_weight."""

    def wrapper(data: Any) -> Any:
        data = keras.tree.map_structure(
            lambda i: None if isinstance(i, tf.experimental.Optional) else i, data
        )
        return step(data)

    return wrapper


def _make_step_function(model: Any, step_function: Any, kind: str, config: Any) -> Any:
    """Keras's ``TensorFlowTrainer._make_function`` with a rewritten per-batch step."""
    one_step_on_data = _one_step(model, step_function, kind, config)
    steps = int(model.steps_per_execution)

    @tf.autograph.experimental.do_not_convert
    def multi_step_on_iterator(iterator: Any) -> Any:
        if steps == 1:
            return tf.experimental.Optional.from_value(one_step_on_data(iterator.get_next()))
        # Keras's own loop: every step, the first included, runs only on data that is there
        # (an Optional), so the call that meets the end of the data runs no step. A first
        # step run on get_next() outside the loop still ran its state updates that read no
        # data (the optimizer's iterations) in that call: one extra step per epoch of a
        # dataset of unknown length. The outputs' spec is known once the step is traced.
        empty = tf.experimental.Optional.empty(None)

        def cond(i: Any, outputs: Any, upcoming: Any) -> Any:
            return tf.logical_and(tf.less(i, steps), upcoming.has_value())

        def one_iteration(i: Any, outputs: Any, upcoming: Any) -> Any:
            def run() -> Any:
                ran = tf.experimental.Optional.from_value(one_step_on_data(upcoming.get_value()))
                upstream_tf.set_optional_element_spec(empty, ran.element_spec)
                return ran

            def keep() -> Any:
                upstream_tf.set_optional_element_spec(outputs, empty.element_spec)
                return outputs

            new = tf.cond(cond(i, outputs, upcoming), run, keep)
            following = tf.cond(
                tf.less(i + 1, steps), iterator.get_next_as_optional, lambda: upcoming
            )
            return i + 1, new, following

        # Keras unrolls ``unrolled_steps_per_execution`` steps into each iteration of the
        # loop (an attribute users set); a step past ``steps`` or the data's end runs nothing.
        unrolled = max(1, min(int(getattr(model, "unrolled_steps_per_execution", 1)), steps))

        def body(i: Any, outputs: Any, upcoming: Any) -> Any:
            for _ in range(unrolled):
                i, outputs, upcoming = one_iteration(i, outputs, upcoming)
            return i, outputs, upcoming

        start = (tf.constant(0), empty, iterator.get_next_as_optional())
        _, final, _ = tf.while_loop(cond, body, start)
        upstream_tf.set_optional_element_spec(final, empty.element_spec)
        return final

    if not model.run_eagerly:
        # TensorFlow's own tf.function: the public name may point at tf_amp's (activation).
        multi_step_on_iterator = upstream_tf.tf_function(
            multi_step_on_iterator, reduce_retracing=True
        )

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
    """Keras's ``make_predict_function`` with a rewritten per-batch step."""
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
        predict_function = upstream_tf.tf_function(predict_function, reduce_retracing=True)
    return predict_function
