"""Loss scaling for code that never asked for it (environment activation only).

An unmodified script does not call ``scale_loss``. Three shapes of script are covered:

* Keras ``fit``: ``compile`` wraps the optimizer (see :mod:`tf_amp.runtime.keras_fit`).
* TF1 ``optimizer.minimize(loss)``: routed through a ``tf_amp.LossScaleOptimizer`` of the same
  optimizer, created once per optimizer and cached on it (:func:`v1_minimize_patch`).
* A custom loop: ``grads = tape.gradient(loss, vars)`` then ``opt.apply_gradients(...)``.
  :func:`gradient_patch` seeds the backward pass with ``scale`` instead of 1 (the same as
  differentiating ``loss * scale``, but needs nothing recorded on the tape), unscales and checks
  the gradients with the fused op, and leaves the finite flag for the next Keras ``apply`` in
  the same graph; :func:`keras_apply_patch` then applies only when the flag is true and moves the
  process-wide scale with ``tf_amp.loss_scale``'s dynamic policy. A skipped step changes no
  weight, slot or ``iterations``.

The scale of the custom-loop path lives in non-trainable variables named
``tf_amp_auto_loss_scale/*``, created on first use outside any function.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"vars": None, "policy": None, "pending": {}, "local": threading.local()}


def reset() -> None:
    """Forgets the custom-loop scale state (called on deactivation)."""
    with _LOCK:
        _STATE["vars"] = None
        _STATE["policy"] = None
        _STATE["pending"] = {}


def _policy() -> Any:
    if _STATE["policy"] is None:
        from tf_amp.loss_scale import DynamicLossScale

        _STATE["policy"] = DynamicLossScale()
    return _STATE["policy"]


def state_variables() -> list[tf.Variable]:
    """The custom-loop loss-scale variables (created on first call)."""
    with _LOCK:
        if _STATE["vars"] is None:
            with tf.init_scope():  # eager, outside any function being traced
                initial = _policy().initial_state()
                _STATE["vars"] = [
                    tf.Variable(value, trainable=False, name=f"tf_amp_auto_loss_scale/{field}")
                    for field, value in zip(initial._fields, initial, strict=True)
                ]
        return _STATE["vars"]


def current_state() -> Any:
    from tf_amp.loss_scale import LossScaleState

    return LossScaleState(*(v.read_value() for v in state_variables()))


def _graph_key() -> Any:
    return "eager" if tf.executing_eagerly() else id(tf.compat.v1.get_default_graph())


def gradient_patch(
    original: Callable[..., Any], is_user_caller: Callable[[], bool]
) -> Callable[..., Any]:
    """``GradientTape.gradient`` that loss-scales when user code calls it."""
    from tensorflow.python.util import nest

    from tf_amp.ops import unscale_and_check_finite

    def gradient(
        self: Any,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        unconnected_gradients: Any = tf.UnconnectedGradients.NONE,
    ) -> Any:
        if not is_user_caller() or not _is_float_scalar(target):
            return original(self, target, sources, output_gradients, unconnected_gradients)
        scale = current_state().scale
        seed = tf.cast(scale, target.dtype)
        seed = seed * (tf.ones_like(target) if output_gradients is None else output_gradients)
        grads = original(self, target, sources, seed, unconnected_gradients)
        flat = nest.flatten(grads)
        present = [i for i, g in enumerate(flat) if g is not None]
        unscaled, finite = unscale_and_check_finite([flat[i] for i in present], scale)
        for i, value in zip(present, unscaled, strict=True):
            flat[i] = value
        _STATE["pending"][_graph_key()] = finite
        return nest.pack_sequence_as(grads, flat)

    gradient.__wrapped__ = original  # type: ignore[attr-defined]
    return gradient


def _is_float_scalar(target: Any) -> bool:
    return (
        isinstance(target, tf.Tensor | tf.Variable)
        and target.dtype.is_floating
        and target.shape.rank == 0
    )


def keras_apply_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """Keras ``BaseOptimizer.apply`` skipping the step when the last scaled gradients overflowed."""

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        finite = _STATE["pending"].pop(_graph_key(), None)
        if finite is None or getattr(self, "_tf_amp_loss_scale_wrapper", False):
            return original(self, grads, trainable_variables)
        grads = list(grads)
        if not self.built:
            variables = trainable_variables
            if variables is None:
                raise ValueError("pass trainable_variables on the first apply()")
            self.build(list(variables))

        def apply_fn() -> tf.Tensor:
            original(self, grads, trainable_variables)
            return tf.constant(True)

        applied = tf.cond(finite, apply_fn, lambda: tf.constant(False))
        policy = _policy()
        with tf.control_dependencies([applied]):
            new_state = policy.adjust(current_state(), finite)
        for var, value in zip(state_variables(), new_state, strict=True):
            var.assign(tf.cast(value, var.dtype))
        return None

    apply.__wrapped__ = original  # type: ignore[attr-defined]
    return apply


def v1_minimize_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``tf.compat.v1.train.Optimizer.minimize`` through a cached loss-scale wrapper."""

    def minimize(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_tf_amp_loss_scale_wrapper", False):
            return original(self, loss, *args, **kwargs)
        wrapper = self.__dict__.get("_tf_amp_auto_wrapper")
        if wrapper is None:
            from tf_amp.optimizers import LossScaleOptimizer

            wrapper = LossScaleOptimizer(self, loss_scale="dynamic")
            self.__dict__["_tf_amp_auto_wrapper"] = wrapper
        return wrapper.minimize(loss, *args, **kwargs)

    minimize.__wrapped__ = original  # type: ignore[attr-defined]
    return minimize


def v1_wrapper_of(optimizer: Any) -> Any:
    """The loss-scale wrapper the environment activation put around a v1 optimizer, if any."""
    return optimizer.__dict__.get("_tf_amp_auto_wrapper")
