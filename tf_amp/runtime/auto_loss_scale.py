"""Loss scaling for code that never asked for it (environment activation only).

An unmodified script does not call ``scale_loss``. Three shapes of script are covered:

* Keras ``fit``: ``compile`` wraps the optimizer (:mod:`tf_amp.runtime.auto_loss_scale_fit`).
* TF1 ``optimizer.minimize(loss)``, or ``compute_gradients`` then ``apply_gradients`` (with
  clipping or anything else in between): routed through a ``tf_amp.LossScaleOptimizer`` of the
  same optimizer, created once per optimizer and cached on it
  (:mod:`tf_amp.runtime.auto_loss_scale_v1`).
* A custom loop: ``grads = tape.gradient(loss, vars)`` then ``opt.apply_gradients(...)``.
  :func:`gradient_patch` seeds the backward pass with ``scale`` instead of 1 (the same as
  differentiating ``loss * scale``, but needs nothing recorded on the tape), unscales and checks
  the gradients with the fused op, and leaves the finite flag for the Keras ``apply`` of those
  gradients in the same graph; :func:`keras_apply_patch` then applies only when the flag is true
  (ANDed over replicas under ``tf.distribute``) and moves the strategy's scale with
  ``tf_amp.loss_scale``'s dynamic policy, through the same code as ``tf_amp.LossScaleOptimizer``.
  A skipped step changes no weight, slot or ``iterations``.

  Scaled only when the sources include a variable: gradients of tensors only (a saliency
  map, an adversarial input, forces as ``-dE/dx``) are no step a skip could hold back, and
  scaled, an overflow came back inf on every call. Real float gradients go through the fused
  op, complex ones are divided and checked apart, integer parts pass as they are. Once any
  call was scaled, an ``apply`` with no flag to take checks the gradients it is given: a
  flag left in a ``tf.map_fn`` body or in another ``tf.function`` cannot reach it.

  Not scaled: the loss a loss-scale wrapper scaled (``scale_loss`` / ``get_scaled_loss`` of
  tf_amp's, Keras 3's or tf_keras's wrapper): the script scales already, and that wrapper's
  ``apply`` unscales and skips. Also not scaled: a ``gradient`` call that a tape records (an
  outer tape still open, or a persistent tape called inside its own ``with``). Its result may
  be differentiated again (gradient penalty, WGAN-GP, Hessian-vector products) and the fused
  unscale op has no gradient; such a call is computed exactly as without tf_amp. The
  outermost ``gradient`` call is the scaled one.

  Finite flags: each scaled call leaves one, per graph (held weakly: it goes with its graph). An
  ``apply`` takes the flags of the calls that returned the gradients it is given (the latest
  one when they were transformed in between, e.g. clipped) and drops every older flag, so a
  GAN's two gradient calls then two applies each get their own flag and no stale flag reaches a
  later step.

The scale of the custom-loop path lives in non-trainable variables named
``tf_amp_auto_loss_scale/*``, created on first use outside any function, and tracked by every
Keras optimizer that applies through it (:func:`attach_state`), so ``tf.train.Checkpoint``
saves and restores the schedule with the optimizer. The v1 path's wrapper is tracked by its
optimizer the same way.

Checkpointing limits (no clean way exists in these cases):

* Keras ``model.save`` / ``.keras`` files and ``save_weights`` do not hold the custom-loop
  state: Keras saves ``optimizer.variables`` by position, and adding ours there would make such
  a file fail to load into an optimizer built without the environment variable. A resumed run
  restarts at the initial scale (the schedule recovers within a few steps).
* The state is one per ``tf.distribute`` strategy (the default one included), shared by every
  optimizer on this path under it (a GAN's two optimizers checkpoint the same variables,
  which ``tf.train.Checkpoint`` saves once). A variable made under one strategy cannot serve
  another: a loop under a second strategy starts from the initial scale.
* Eager (no ``tf.function``) custom loop restored before its first step: the first
  ``tape.gradient`` runs before the optimizer is known, so that one step is scaled by the
  initial scale; its ``apply`` then attaches and restores, and the schedule continues from the
  restored state. Inside a ``tf.function`` the restore happens while tracing, before the step
  runs, so the first step already uses the restored scale.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_amp._say_once import say_once
from tf_amp._upstream import tensorflow as upstream_tf

_LOG = logging.getLogger("tf_amp")
_LOCK = threading.Lock()
_STATE: dict[str, Any] = {
    # The strategies holding a state (under _STATE_KEY in their __dict__: the variables and
    # the HostFloorAlarm of steps XLA compiled). A variable made under one strategy (a
    # MirroredVariable) cannot serve another, and a loop under a second strategy, or none,
    # failed ("Mixing different tf.distribute.Strategy objects"). The default strategy is one
    # of them. Kept on the strategy, not in a dict keyed by it: its variables refer to it, so
    # a dict entry would keep it alive for good.
    "strategies": weakref.WeakSet(),
    "policy": None,
    # graph -> {thread: [(gradients returned, finite flag)]}: a strategy runs each replica in
    # a thread of its own, in one graph, and they meet at an all-reduce between tape.gradient
    # and apply; one list per graph handed replica 1's flag to replica 0's apply.
    "pending": weakref.WeakKeyDictionary(),
    # Whether any gradient call was scaled: from then on an apply with no flag to take checks
    # the gradients it is given (see take_finite_flag).
    "scaled_any": False,
}
_STATE_KEY = "_tf_amp_auto_loss_scale"  # a strategy's state, in its __dict__
_MAX_PENDING = 16  # flags kept per graph (eager: gradient calls that no apply follows)


def reset() -> None:
    """Forgets the custom-loop scale state (called on deactivation)."""
    with _LOCK:
        for strategy in list(_STATE["strategies"]):
            strategy.__dict__.pop(_STATE_KEY, None)
        _STATE["strategies"] = weakref.WeakSet()
        _STATE["policy"] = None
        _STATE["pending"] = weakref.WeakKeyDictionary()
        _STATE["scaled_any"] = False


def _policy() -> Any:
    if _STATE["policy"] is None:
        from tf_amp.loss_scale import DynamicLossScale

        _STATE["policy"] = DynamicLossScale()
    return _STATE["policy"]


def _state(strategy: Any = None) -> tuple[list[tf.Variable], Any]:
    """A strategy's custom-loop variables and floor alarm (made on first use): ``strategy``'s,
    else the current one's. An optimizer names its own: gradients reduced after
    ``strategy.run`` are applied outside the strategy's scope, with the scale its replicas
    used."""
    strategy = strategy or tf.distribute.get_strategy()
    with _LOCK:
        found = strategy.__dict__.get(_STATE_KEY)
        if found is None:
            in_scope = (  # made as the strategy's own variables, wherever first asked for
                strategy.scope()
                if tf.distribute.get_strategy() is not strategy
                else contextlib.nullcontext()
            )
            with tf.init_scope(), in_scope:  # eager, outside any function being traced
                initial = _policy().initial_state()
                # ONLY_FIRST_REPLICA: under a strategy every replica computes the same new
                # state (the finite flag is ANDed over replicas), and a replica-context write
                # needs an aggregation.
                variables = [
                    tf.Variable(
                        value,
                        trainable=False,
                        name=f"tf_amp_auto_loss_scale/{field}",
                        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                    )
                    for field, value in zip(initial._fields, initial, strict=True)
                ]
                from tf_amp.optimizers._host_floor_alarm import HostFloorAlarm

                found = strategy.__dict__[_STATE_KEY] = (variables, HostFloorAlarm())
                _STATE["strategies"].add(strategy)
        return found


def state_variables(strategy: Any = None) -> list[tf.Variable]:
    """The custom-loop loss-scale variables of ``strategy`` (default: the current one), made
    on first call."""
    return _state(strategy)[0]


def optimizer_strategy(optimizer: Any) -> Any:
    """The strategy an optimizer was made under (Keras and tf_keras keep it), or None."""
    return getattr(optimizer, "_distribution_strategy", None)


def made_any_state() -> bool:
    """Whether a custom loop has made loss-scale variables under any strategy."""
    return len(_STATE["strategies"]) > 0


def _all_states() -> list[tuple[list[tf.Variable], Any]]:
    with _LOCK:
        return [s.__dict__[_STATE_KEY] for s in list(_STATE["strategies"])
                if _STATE_KEY in s.__dict__]


def check_skips() -> None:
    """The floor warnings (and their counts) of custom-loop steps XLA compiled, said on the
    host, as a wrapper's ``check_skips()`` says them: such a step can neither print nor
    assert. ``LossScaleCallback`` calls this for a model whose optimizer applies through this
    path. Costs nothing until such a step was traced."""
    from tf_amp.optimizers import _common

    for _, alarm in _all_states():
        with alarm.lock:
            alarm.check(_policy(), _common.FLOOR_WARNING_SKIPS, None)


STATE_NAME = "tf_amp_auto_loss_scale"
"""Prefix of the checkpoint names under which a user's optimizer tracks the custom-loop state
(``<optimizer>/tf_amp_auto_loss_scale_scale``, ``..._good_steps``, ...)."""


def attach_state(optimizer: Any) -> None:
    """Tracks the custom-loop loss-scale variables on the user's Keras ``optimizer``.

    Why: those variables exist for the process, not for any object a script checkpoints, so
    ``tf.train.Checkpoint(optimizer=opt)`` (or ``(model=model)``, which tracks
    ``model.optimizer``) would drop them and a resumed run would restart at 2**15. Tracked as
    dependencies of the optimizer they are saved with it, and a checkpoint restored before the
    first step (deferred restoration) is applied the moment they are attached. Only TensorFlow
    tracking is used, not Keras's: ``optimizer.variables`` and Keras ``.keras`` files are
    unchanged, so a file saved under the environment variable still loads without it.
    """
    variables = state_variables(optimizer_strategy(optimizer))
    if optimizer.__dict__.get("_tf_amp_auto_state") is variables:
        return
    from tf_amp.loss_scale import LossScaleState

    with tf.init_scope():  # a deferred restore assigns eagerly, not inside a traced function
        for field, var in zip(LossScaleState._fields, variables, strict=True):
            optimizer._track_trackable(var, f"{STATE_NAME}_{field}", overwrite=True)  # noqa: SLF001
    optimizer.__dict__["_tf_amp_auto_state"] = variables


def current_state() -> Any:
    from tf_amp.loss_scale import LossScaleState

    return LossScaleState(*(v.read_value() for v in state_variables()))


class _Eager:
    """The key of eager flags (weakly referenceable, unlike a string)."""


_EAGER = _Eager()


def _graph_key() -> Any:
    return _EAGER if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def _recorded_by_a_tape(tape: Any) -> bool:
    """True when the gradient computation ``tape.gradient`` is about to run is recorded by a
    tape (it may be differentiated again). A non-persistent tape stops recording first, as
    ``GradientTape.gradient`` does itself (same private attributes, TF 2.x)."""
    if getattr(tape, "_recording", False) and not getattr(tape, "_persistent", True):
        tape._pop_tape()  # noqa: SLF001
    return upstream_tf.could_possibly_record()


def _threads() -> dict[int, list[tuple[list[Any], Any]]]:
    """This graph's pending flags, per thread (made empty on first use)."""
    return _STATE["pending"].setdefault(_graph_key(), {})


def _pending() -> bool:
    """Whether an ``apply`` here has a flag to take: this thread's, or, outside a replica,
    any replica thread's (gradients computed in ``strategy.run``, reduced and applied outside
    it)."""
    threads = _STATE["pending"].get(_graph_key())
    if not threads:
        return False
    if threads.get(threading.get_ident()):
        return True
    return _outside_replicas() and any(threads.values())


def _outside_replicas() -> bool:
    """True unless this thread runs a replica of a strategy (inside ``strategy.run``)."""
    return not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context()


def _leave_pending(gradients: list[Any], finite: Any) -> None:
    threads = _threads()
    entries = threads.setdefault(threading.get_ident(), [])
    entries.append((gradients, finite))
    del entries[:-_MAX_PENDING]
    if len(threads) > _MAX_PENDING:  # threads that never applied (a reused id inherits none)
        for stale in list(threads)[: len(threads) - _MAX_PENDING]:
            del threads[stale]


def _take_pending(grads: list[Any]) -> Any:
    """The finite flag for an ``apply`` of ``grads`` (None when no scaled call left one).

    This thread's flags: those left with ``grads``. When ``grads`` are none of the tensors a
    call returned (summed over micro-batches, clipped, averaged over a ``vectorized_map``),
    whether they are all finite: the latest call's flag alone let an overflow of an earlier
    micro-batch, or of a GAN's other tape, reach the weights as NaN. With no flag in this
    thread, outside the replicas: every replica thread's flags, ANDed, since the gradients
    applied there were reduced from all of them.
    """
    threads = _STATE["pending"].get(_graph_key())
    if not threads:
        return None
    me = threading.get_ident()
    entries = threads.get(me)
    if not entries:
        if not _outside_replicas():
            return None
        flags = [finite for listed in threads.values() for _, finite in listed]
        threads.clear()
        return _all_of(flags)
    given = {id(g) for g in grads if g is not None}
    chosen = [i for i, (ts, _) in enumerate(entries) if any(id(t) in given for t in ts)]
    flag = _all_of([entries[i][1] for i in chosen]) if chosen else _all_finite(grads)
    del entries[: (chosen[-1] if chosen else len(entries) - 1) + 1]
    if not entries:  # a replica's thread ends with its step: leave no list behind for it
        del threads[me]
    return flag


def _all_of(flags: list[Any]) -> Any:
    if not flags:
        return None
    return flags[0] if len(flags) == 1 else tf.reduce_all(tf.stack(flags))


# --- tf_keras hook: the hand-off that tf_keras optimizers' patched apply_gradients uses
# (runtime/tf_keras_env.py); the same flags and policy as Keras 3's apply patch below.
def take_finite_flag(grads: list[Any]) -> Any:
    """The finite flag for an ``apply`` of ``grads``: the flags scaled ``tape.gradient`` calls
    left with them in this graph (whether ``grads`` are all finite when they were combined or
    transformed in between: :func:`_take_pending`), else, once any call was scaled, whether
    ``grads`` are all finite; None before any call was scaled."""
    if _pending():
        return _take_pending(list(grads))
    if not _STATE["scaled_any"]:
        return None
    # Gradients scaled where their flag cannot reach this apply: in a tf.map_fn or loop body
    # (per-example gradients), or in another tf.function (accumulated over micro-batches in
    # variables, applied later). An overflow is still inf or NaN in them; unchecked, it was
    # applied, and the scale never moved down: NaN weights for good.
    return _all_finite(list(grads))


def _all_finite(grads: list[Any]) -> tf.Tensor:
    checks = [
        tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
        for g in grads
        if g is not None and g.dtype.is_floating
    ]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def policy() -> Any:
    """The dynamic ``tf_amp.LossScale`` of the custom-loop path."""
    return _policy()
# --- end of the tf_keras hook


def gradient_patch(
    original: Callable[..., Any], is_user_caller: Callable[[], bool]
) -> Callable[..., Any]:
    """``GradientTape.gradient`` that loss-scales when user code calls it."""

    def gradient(
        self: Any,
        target: Any,
        sources: Any,
        output_gradients: Any = None,
        unconnected_gradients: Any = tf.UnconnectedGradients.NONE,
    ) -> Any:
        if (
            not is_user_caller()
            or not _is_float_scalar(target)
            or not _has_a_variable(sources)
            or _recorded_by_a_tape(self)
            or _scaled_by_a_wrapper(target)
        ):
            return original(self, target, sources, output_gradients, unconnected_gradients)
        scale = current_state().scale
        # A float16 loss with scale >= 65520 seeds inf: that step is skipped and the scale
        # halves. Multiplying in float32 would not help: the gradient of the float16 loss
        # itself (the backward Cast) is that same scale in float16.
        seed = tf.cast(scale, target.dtype) * _one_output_gradient(target, output_gradients)
        grads = original(self, target, sources, seed, unconnected_gradients)
        unscaled, finite = _unscaled(grads, scale)
        _leave_pending([g for g in tf.nest.flatten(unscaled) if g is not None], finite)
        _STATE["scaled_any"] = True
        return unscaled

    gradient.__wrapped__ = original  # type: ignore[attr-defined]
    return gradient


def _has_a_variable(sources: Any) -> bool:
    """Whether any source is a variable (``tf.Variable``, a Keras variable): gradients that
    an optimizer may apply. Gradients of tensors only (a saliency map, an adversarial
    example, forces as ``-dE/dx``) are no update that a skipped step could hold back: scaled,
    one that overflowed came back inf, every call, since no ``apply`` moved the scale down."""
    return any(
        s is not None and not isinstance(s, tf.Tensor | tf.IndexedSlices)
        for s in tf.nest.flatten(sources, expand_composites=True)
    )


def _one_output_gradient(target: tf.Tensor, output_gradients: Any) -> tf.Tensor:
    """The gradient seeded into ``target`` before scaling: ones, or the one given, as a
    tensor or in TensorFlow's list form (``[tf.constant(2.0)]``: multiplied by the scale as
    given, a list became a shape-[1] seed, and the backward pass failed on the shape)."""
    if output_gradients is None:
        return tf.ones_like(target)
    flat = tf.nest.flatten(output_gradients)
    if len(flat) != 1:
        raise ValueError(
            f"tape.gradient: one target takes one output gradient, got {len(flat)}"
        )
    if flat[0] is None:
        return tf.ones_like(target)
    return tf.cast(flat[0], target.dtype)


def _unscaled(grads: Any, scale: tf.Tensor) -> tuple[Any, tf.Tensor]:
    """``grads`` divided by ``scale``, in their structure, and whether all are finite.

    Real float gradients go through the fused op; a complex one (a complex variable's) is
    divided and checked on its own; integer parts (a ``RaggedTensor``'s row splits, an
    integer source's zero gradient) pass as they are. The fused op refused everything but
    the four float types, and ``RaggedTensor`` gradients whole."""
    # Imported here: the patch is made when TensorFlow finishes loading, which may be inside
    # ``import tf_amp.ops`` itself.
    from tf_amp.ops import unscale_and_check_finite

    flat = tf.nest.flatten(grads, expand_composites=True)
    real = [i for i, g in enumerate(flat) if g is not None and g.dtype.is_floating]
    unscaled, finite = unscale_and_check_finite([flat[i] for i in real], scale)
    for i, value in zip(real, unscaled, strict=True):
        flat[i] = value
    flags = [finite]
    for i, g in enumerate(flat):
        if g is not None and g.dtype.is_complex:
            flat[i] = g / tf.cast(scale, g.dtype)
            flags.append(tf.reduce_all(tf.math.is_finite(tf.math.real(flat[i])))
                         & tf.reduce_all(tf.math.is_finite(tf.math.imag(flat[i]))))
    return tf.nest.pack_sequence_as(grads, flat, expand_composites=True), _all_of(flags)


def _scaled_by_a_wrapper(target: Any) -> bool:
    """True for a loss a loss-scale wrapper's ``scale_loss`` / ``get_scaled_loss`` returned:
    its gradients are that wrapper's to unscale, and scaling them again would multiply the two
    scales (``tf_amp.optimizers._scaled_losses`` says what went wrong when they were)."""
    from tf_amp.optimizers import _scaled_losses

    if not _scaled_losses.is_marked(target):
        return False
    say_once(
        "auto loss scale: scaled by a wrapper",
        logging.INFO,
        "a loss scaled by a loss-scale optimizer is left to it: the automatic loss "
        "scaling of custom loops does not scale its gradients again",
    )
    return True


def _is_float_scalar(target: Any) -> bool:
    return (
        isinstance(target, tf.Tensor | tf.Variable)
        and target.dtype.is_floating
        and target.shape.rank == 0
    )


def keras_apply_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """Keras ``BaseOptimizer.apply`` skipping the step when the last scaled gradients overflowed."""

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        if is_tf_amp_wrapper(self):  # it scaled and checks its own; flags left here are spent
            if _pending():
                grads = list(grads)
                _take_pending(grads)
            return original(self, grads, trainable_variables)
        if _pending() or _STATE["scaled_any"]:
            grads = list(grads)
            finite = take_finite_flag(grads)
        else:
            finite = None
        if finite is None:
            return original(self, grads, trainable_variables)
        attach_state(self)
        if not self.built:
            variables = trainable_variables
            if variables is None:
                raise ValueError("pass trainable_variables on the first apply()")
            self.build(list(variables))

        from tf_amp.optimizers import _apply_or_skip, _common

        state_vars, alarm = _state(optimizer_strategy(self))
        # The same decision as tf_amp.LossScaleOptimizer: ANDed over replicas, one cond that
        # applies or skips and moves the scale, the floor alarm, and under MirroredStrategy
        # the cond in the cross-replica context (the inner apply all-reduces gradients).
        _apply_or_skip.apply_if_finite(
            _apply_or_skip.all_replicas_finite(finite),
            lambda g, v: original(self, g, v),
            grads,
            trainable_variables,
            _policy(),
            state_vars,
            floor_warning_skips=_common.FLOOR_WARNING_SKIPS,
            max_consecutive_skips=None,
            events=alarm.events,
        )
        return None

    apply.__wrapped__ = original  # type: ignore[attr-defined]
    return apply


def v1_wrapper_of(optimizer: Any) -> Any:
    """The loss-scale wrapper the environment activation put around a v1 optimizer, if any."""
    return optimizer.__dict__.get("_tf_amp_auto_wrapper")


def is_tf_amp_wrapper(optimizer: Any) -> bool:
    """True for a tf_amp LossScaleOptimizer, which this path must leave to itself."""
    # Imported on use: this module loads while Keras is still importing (env activation).
    from tf_amp.optimizers import _common

    return _common.is_tf_amp_wrapper(optimizer)
