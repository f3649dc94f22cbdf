"""Loss scaling for unmodified TF1 scripts (environment activation only).

``optimizer.minimize(loss)``, or ``compute_gradients`` then ``apply_gradients`` (with clipping
or anything else in between), called by user code on a ``tf.compat.v1.train.Optimizer``, are
routed through a ``tf_amp.LossScaleOptimizer`` of the same optimizer, created once per
optimizer and cached on it, so the three share one loss scale. Its state variables are global
variables: ``Saver`` saves them, and the ``Saver`` patches below let a checkpoint written
without tf_amp (float32 training) restore into such a graph, the scale starting afresh (any
v1 wrapper's state, explicit too: ``tf_amp.optimizers._v1_saver``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from tf_amp.runtime.auto_loss_scale import STATE_NAME, is_tf_amp_wrapper, v1_wrapper_of

_LOG = logging.getLogger("tf_amp")
# .depth: how many wrapper calls this thread is inside; .scale_in_base: the optimizer whose
# base compute_gradients is to scale (see v1_minimize_patch).
_LOCAL = threading.local()


def _v1_wrapper(optimizer: Any) -> Any:
    """The cached ``tf_amp.LossScaleOptimizer`` of a v1 optimizer (created on first need).

    One wrapper per optimizer, so ``minimize``, ``compute_gradients`` and ``apply_gradients``
    share one loss scale, and its state variables (global variables) are saved by ``Saver``.
    """
    wrapper = optimizer.__dict__.get("_tf_amp_auto_wrapper")
    if wrapper is None:
        from tf_amp.optimizers import LossScaleOptimizer

        wrapper = LossScaleOptimizer(optimizer, loss_scale="dynamic")
        optimizer.__dict__["_tf_amp_auto_wrapper"] = wrapper
        # tf.train.Checkpoint(optimizer=opt) saves the scale too (the wrapper tracks its state
        # variables; Saver already saves them as global variables). Restoring before the first
        # step restores them when this attaches, ahead of the first scaled loss.
        with tf.init_scope():
            optimizer._track_trackable(wrapper, STATE_NAME, overwrite=True)  # noqa: SLF001
    return wrapper


@contextlib.contextmanager
def _inside_wrapper() -> Iterator[None]:
    """Marks this thread as running a wrapper call: its calls back into the (patched) inner
    optimizer must reach the original methods, even from a user subclass's override."""
    local = _LOCAL
    local.depth = getattr(local, "depth", 0) + 1
    try:
        yield
    finally:
        local.depth -= 1


def _passes_through(optimizer: Any) -> bool:
    """True for an optimizer that scales its loss itself (tf_amp's wrapper, or TensorFlow's
    own ``MixedPrecisionLossScaleOptimizer`` that TF1's
    ``tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite`` returns: wrapped
    again, its loss was scaled twice, and tf_amp's scale fell to its floor skipping the first
    15 steps), and for the inner optimizer's calls from inside a wrapper."""
    return (
        is_tf_amp_wrapper(optimizer)
        or isinstance(optimizer, tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer)
        or getattr(_LOCAL, "depth", 0) > 0
    )


def v1_minimize_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``tf.compat.v1.train.Optimizer.minimize`` through a cached loss-scale wrapper.

    A subclass that overrides ``compute_gradients`` (to clip, all-reduce or log what its
    ``super()`` call returns) gets its override run on the true loss, with the scaling done in
    the first base method it reaches (``_LOCAL.scale_in_base``), on it or on an optimizer it
    hands the call to (``SyncReplicasOptimizer``, Horovod's ``DistributedOptimizer``): wrapped
    whole, the override saw gradients times 2**15, so a clip by norm 1 left updates 2**15
    times too small.
    """
    signature = inspect.signature(original)

    def minimize(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        if _passes_through(self):
            return original(self, loss, *args, **kwargs)
        wrapper = _v1_wrapper(self)
        if type(self).compute_gradients is tf.compat.v1.train.Optimizer.compute_gradients:
            with _inside_wrapper():
                return wrapper.minimize(loss, *args, **kwargs)
        bound = signature.bind(self, loss, *args, **kwargs)
        bound.apply_defaults()
        given = dict(bound.arguments)
        global_step, name = given.pop("global_step"), given.pop("name")
        del given["self"], given["loss"]
        _LOCAL.scale_in_base = self
        try:
            with _inside_wrapper():
                grads_and_vars = self.compute_gradients(loss, **given)
        finally:
            _LOCAL.scale_in_base = None
        if not any(g is not None for g, _ in grads_and_vars):
            raise ValueError(
                f"No gradients provided for any variable, check your graph for ops that do not "
                f"support gradients, between variables {[str(v) for _, v in grads_and_vars]} "
                f"and loss {loss}."
            )
        with _inside_wrapper():
            return wrapper.apply_gradients(grads_and_vars, global_step=global_step, name=name)

    minimize.__wrapped__ = original  # type: ignore[attr-defined]
    return minimize


def v1_compute_gradients_patch(
    original: Callable[..., Any], is_user_caller: Callable[[], bool]
) -> Callable[..., Any]:
    """``Optimizer.compute_gradients`` called by user code (or reached from a subclass's
    override that ``minimize`` runs): gradients of the scaled loss, unscaled, so a script or
    an override that clips or inspects them sees true gradients. The scaling happens here, in
    the base method, so an override is never run a second time by the wrapper."""
    signature = inspect.signature(original)

    def compute_gradients(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        # The optimizer whose minimize asked the first base call to scale (it may be this
        # one's caller: an optimizer that hands compute_gradients to another).
        asker = getattr(_LOCAL, "scale_in_base", None)
        if asker is None and (_passes_through(self) or not is_user_caller()):
            return original(self, loss, *args, **kwargs)
        _LOCAL.scale_in_base = None  # the first base call scales, no nested one
        bound = signature.bind(self, loss, *args, **kwargs)
        given = dict(bound.arguments)
        del given["self"], given["loss"]
        with _inside_wrapper():
            return _v1_wrapper(asker if asker is not None else self).scaled_gradients(
                functools.partial(original, self), loss, **given)

    compute_gradients.__wrapped__ = original  # type: ignore[attr-defined]
    return compute_gradients


def v1_apply_gradients_patch(
    original: Callable[..., Any], is_user_caller: Callable[[], bool]
) -> Callable[..., Any]:
    """``Optimizer.apply_gradients`` called by user code on an optimizer that has a loss-scale
    wrapper (it scaled a loss in ``compute_gradients`` or ``minimize``): the wrapper applies
    under its finite check, so a non-finite step changes no variable, slot or ``global_step``,
    and moves the scale. Optimizers that never scaled a loss apply as before."""

    def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        wrapper = v1_wrapper_of(self)
        in_tf1_graph = not tf.compat.v1.executing_eagerly_outside_functions()
        if wrapper is None and in_tf1_graph and is_user_caller() and not _passes_through(self):
            _say_gradients_not_scaled(self)
        if wrapper is None or _passes_through(self) or not is_user_caller():
            return original(self, grads_and_vars, *args, **kwargs)
        with _inside_wrapper():
            return wrapper.apply_gradients(grads_and_vars, *args, **kwargs)

    apply_gradients.__wrapped__ = original  # type: ignore[attr-defined]
    return apply_gradients


def _say_gradients_not_scaled(optimizer: Any) -> None:
    """In a TF1 graph, an ``apply_gradients`` with no ``compute_gradients`` / ``minimize`` of
    the same optimizer before it got gradients tf_amp did not scale (``tf.gradients``, the
    BERT recipe): their small values may underflow float16, and nothing says so otherwise."""
    from tf_amp._say_once import say_once

    say_once(
        ("v1 apply of unscaled gradients", id(optimizer)),
        logging.WARNING,
        "%s.apply_gradients() got gradients that tf_amp did not loss-scale (computed with "
        "tf.gradients, not this optimizer's compute_gradients or minimize): under "
        "TF_ENABLE_AUTO_MIXED_PRECISION they are applied as they are, and small gradients "
        "may have underflowed to 0 in the float16 backward pass. Use "
        "opt.compute_gradients(loss), or wrap the optimizer "
        "in tf_amp.LossScaleOptimizer and scale the loss with get_scaled_loss().",
        type(optimizer).__name__,
    )


def v1_variables_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Optimizer.variables()`` with the state of the optimizer's loss-scale wrapper, which
    the environment made and the script cannot see: ``tf.variables_initializer(
    opt.variables())`` and ``Saver(... + opt.variables())`` (resetting or saving an
    optimizer) left it uninitialized or unsaved, and the next step failed."""

    def variables(self: Any) -> Any:
        found = original(self)
        wrapper = v1_wrapper_of(self)
        state = getattr(wrapper, "_state_vars", None) if wrapper is not None else None
        if not state:
            return found
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        ids = {id(v) for v in found}
        extra = [v for v in state
                 if id(v) not in ids and (graph is None or getattr(v, "graph", None) is graph)]
        return list(found) + extra

    variables.__wrapped__ = original  # type: ignore[attr-defined]
    return variables


