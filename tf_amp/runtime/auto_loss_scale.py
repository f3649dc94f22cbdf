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

  Scaled only when the sources include a variable, an ``apply`` takes the gradients and
  nothing else writes state with them first: only an apply can skip a step that overflowed.
  Gradients of tensors only (a saliency map, an adversarial input, forces as ``-dE/dx``),
  and gradients that update variables any other way (``w.assign_sub(lr * g)``, SAM's
  perturbation) got an overflow at 2**15 to the weights or the caller as inf. Nothing at the
  call says where its gradients go, so a traced call starts at scale 1 and is switched to
  the loss scale when an ``apply`` later in the trace is given gradients computed from its
  own (:mod:`tf_amp.runtime._gradient_flow` walks the graph back, through loop bodies,
  branches and nested functions); an eager call is scaled once an apply was given an
  earlier call's gradients from the same line (:func:`_scale_of_a_new_call`). Real float
  gradients go through the fused op, complex ones are divided and checked apart, integer
  parts pass as they are. Once any call went through this path, an ``apply`` with no call
  to take a flag from checks the gradients it is given: gradients accumulated in variables
  or made in another ``tf.function`` stay unscaled, but a forward pass that overflowed still
  gives inf there.

  Not scaled: the loss a loss-scale wrapper scaled (``scale_loss`` / ``get_scaled_loss`` of
  tf_amp's, Keras 3's or tf_keras's wrapper): the script scales already, and that wrapper's
  ``apply`` unscales and skips. Also not scaled: a ``gradient`` call that a tape records (an
  outer tape still open, or a persistent tape called inside its own ``with``). Its result may
  be differentiated again (gradient penalty, WGAN-GP, Hessian-vector products) and the fused
  unscale op has no gradient; such a call is computed exactly as without tf_amp. The
  outermost ``gradient`` call is the scaled one.

  Finite flags: each call leaves one, per graph and thread (held weakly: it goes with its
  graph). An ``apply`` takes the flags of the calls its gradients are computed from (eager:
  the calls that returned them) and leaves the others for their own apply, so a GAN's two
  gradient calls then two applies each get their own flag, in either order, and a call no
  apply takes (logged, used by hand) stays unscaled.

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
* Eager (no ``tf.function``) custom loop restored before its first step: the first step from
  each line is unscaled (see above); its ``apply`` then attaches and restores, and the
  schedule continues from the restored state. Inside a ``tf.function`` the restore happens
  while tracing, before the step runs, so the first step already uses the restored scale.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_amp._say_once import say_once
from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp.runtime import _gradient_flow
from tf_amp.runtime._user_callers import user_call_site

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
    # Eager: the user's lines whose tape.gradient calls are scaled (an apply took the
    # gradients of a call made there).
    "eager_sites": set(),
}
_STATE_KEY = "_tf_amp_auto_loss_scale"  # a strategy's state, in its __dict__
_MAX_PENDING = 16  # eager calls kept per thread (each holds its gradients), and threads
_MAX_TRACED_PENDING = 4096  # traced calls kept per graph and thread (symbolic: cheap)


def reset() -> None:
    """Forgets the custom-loop scale state (called on deactivation)."""
    with _LOCK:
        for strategy in list(_STATE["strategies"]):
            strategy.__dict__.pop(_STATE_KEY, None)
        _STATE["strategies"] = weakref.WeakSet()
        _STATE["policy"] = None
        _STATE["pending"] = weakref.WeakKeyDictionary()
        _STATE["scaled_any"] = False
        _STATE["eager_sites"] = set()


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


@dataclasses.dataclass(eq=False)
class _Call:
    """A ``tape.gradient`` call that went through the custom-loop path, waiting for the
    ``apply`` of its gradients.

    Graph mode: traced with scale 1, chosen by ``selector`` (an Identity of the constant
    False, in the function graph that holds the call's loops and branches, so that it is
    still being built when an apply after a loop or a branch holding the call takes its
    gradients); :func:`_consume`
    points ``selector`` at ``switched_on`` (the constant True: the call then uses the loss
    scale) when an ``apply`` built later in the same trace takes gradients computed from the
    call's, and nothing else writes state with them.
    Eager: ``site`` is the user's line that made the call; it is scaled once an ``apply``
    took the gradients of an earlier call from there (the same line, called through the same
    lines of its callers).
    """

    gradients: list[Any]
    finite: Any
    site: tuple[tuple[str, int], ...] = ()
    selector: Any = None  # graph mode: the Identity op that says whether the call is scaled
    switched_on: Any = None  # graph mode: the constant True, beside the selector
    consumed: bool = False
    key: Any = None  # the pending lists it is in: its graph's, or eager's


def _threads() -> dict[int, list[_Call]]:
    """This graph's pending calls, per thread (made empty on first use)."""
    return _STATE["pending"].setdefault(_graph_key(), {})


def _graphs_being_built() -> list[Any]:
    """The keys whose pending calls an ``apply`` here may take: eager's; or this graph's and
    those of the graphs it is nested in (a ``tf.cond`` branch or loop body applying gradients
    computed outside it), all still being built."""
    if tf.executing_eagerly():
        return [_EAGER]
    graphs = []
    graph = tf.compat.v1.get_default_graph()
    while graph is not None and graph not in graphs:
        graphs.append(graph)
        graph = getattr(graph, "outer_graph", None)
    return graphs


def _outside_replicas() -> bool:
    """True unless this thread runs a replica of a strategy (inside ``strategy.run``)."""
    return not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context()


def _leave_pending(call: _Call) -> None:
    """Keeps ``call`` for the apply of its gradients. Graph mode: as many as a trace makes
    (20 micro-batches unrolled in a Python loop each wait for the one apply); they go with
    their graph. Eager: one per line (a call supersedes the last one from its line, never
    applied, say logged), at most :data:`_MAX_PENDING`, since each holds its gradients."""
    call.key = _graph_key()
    threads = _threads()
    entries = threads.setdefault(threading.get_ident(), [])
    if call.selector is None:
        entries[:] = [c for c in entries if c.site != call.site]
        del entries[:-(_MAX_PENDING - 1)]
    else:
        del entries[:-(_MAX_TRACED_PENDING - 1)]
    entries.append(call)
    if len(threads) > _MAX_PENDING:  # threads that never applied (a reused id inherits none)
        for stale in list(threads)[: len(threads) - _MAX_PENDING]:
            del threads[stale]


def _consume(call: _Call) -> None:
    """Loss-scales ``call`` from now on: an ``apply`` checks the flag of its gradients.

    Graph mode: its scale, 1 until now, becomes the loss scale, unless its gradients already
    feed a state update (GSAM's perturbation, combined into the applied gradients too): an
    overflow there has no step to skip. Eager: later calls from the same line are scaled."""
    if call.consumed:
        return
    if call.selector is None:
        call.consumed = True
        _STATE["eager_sites"].add(call.site)
        return
    if call.selector.graph not in _graphs_being_built():
        return  # made in a nested tf.function's finished graph: its switch stays off
    if _gradient_flow.writes_state(tf.nest.flatten(call.gradients, expand_composites=True)):
        return
    call.consumed = True
    upstream_tf.point_input_at(call.selector, 0, call.switched_on)


def _take_pending(grads: list[Any], consume: bool = True) -> Any:
    """The finite flag for an ``apply`` of ``grads`` (None when no call left one), and with
    ``consume``, loss scaling from now on for the calls ``grads`` come from.

    Eager: the calls of this thread that returned tensors of ``grads``. Gradients transformed
    on the way (clipped) cannot be told apart from others: no call is taken, and the caller
    checks ``grads`` themselves. Graph mode: :func:`_take_traced`. Outside the replicas, with
    no call of this thread: every replica thread's calls, whose gradients were reduced into
    ``grads``. Calls not taken stay, for the apply of their own gradients (a GAN's second
    apply), and unscaled until then (a manual update, SAM's first gradient).
    """
    keys = _graphs_being_built()
    lists = [threads for key in keys if (threads := _STATE["pending"].get(key))]
    me = threading.get_ident()
    mine = [entries for threads in lists if (entries := threads.get(me))]
    if not mine and lists and _outside_replicas():
        calls = [call for threads in lists for listed in threads.values() for call in listed]
        for threads in lists:
            threads.clear()
        if consume:
            for call in calls:
                _consume(call)
        return _all_of([call.finite for call in calls])
    if tf.executing_eagerly():
        given = {id(g) for g in grads if g is not None}
        taken = [c for entries in mine for c in entries
                 if any(id(t) in given for t in c.gradients)]
        flags = [c.finite for c in taken]
    else:
        taken, flags = _take_traced(grads, mine)
    for call in taken:
        if consume:
            _consume(call)
        _forget(call)
    return _all_of(flags)


def _take_traced(grads: list[Any], mine: list[list[_Call]]) -> tuple[list[_Call], list[Any]]:
    """The calls ``grads`` are computed from, and the flags to AND.

    Walks the graph back from ``grads`` (:func:`_gradient_flow.sources_of`): this thread's
    calls in the graphs being built whose gradients it reaches give their flags; calls in a
    finished graph that the walk passes through (a ``tf.range`` loop body that accumulates
    gradients, a ``tf.cond`` branch, a nested ``tf.function`` that returns them) are taken
    too, but their flags stay in that graph: whether ``grads`` are all finite stands in."""
    by_key = {
        _gradient_flow.key_of(t): call
        for entries in mine
        for call in entries
        for t in tf.nest.flatten(call.gradients, expand_composites=True)
    }
    reached, inner_graphs = _gradient_flow.sources_of(
        tf.nest.flatten(grads, expand_composites=True), set(by_key)
    )
    taken = list({id(by_key[k]): by_key[k] for k in reached}.values())
    flags = [call.finite for call in taken]
    inner = [
        call
        for graph in inner_graphs
        for listed in (_STATE["pending"].get(graph) or {}).values()
        for call in listed
    ]
    if inner:
        flags.append(_all_finite(grads))
    return taken + inner, flags


def _forget(call: _Call) -> None:
    """Drops a taken call from the pending lists (of its graph, any thread)."""
    threads = _STATE["pending"].get(call.key) or {}
    for thread, listed in list(threads.items()):
        if call in listed:
            listed.remove(call)
            if not listed:
                del threads[thread]


def _all_of(flags: list[Any]) -> Any:
    if not flags:
        return None
    return flags[0] if len(flags) == 1 else tf.reduce_all(tf.stack(flags))


# --- tf_keras hook: the hand-off that tf_keras optimizers' patched apply_gradients uses
# (runtime/tf_keras_env.py); the same flags and policy as Keras 3's apply patch below.
def take_finite_flag(grads: list[Any]) -> Any:
    """The finite flag for an ``apply`` of ``grads``: the flags of the gradient calls that
    ``grads`` come from, which are loss-scaled from then on (:func:`_take_pending`); else,
    once any call went through this path, whether ``grads`` are all finite; None before."""
    if not _STATE["scaled_any"]:
        return None
    grads = list(grads)
    flag = _take_pending(grads)
    # Gradients whose call this apply cannot see: accumulated in variables, or made in
    # another tf.function. Those calls stay unscaled, but a forward pass that overflowed
    # float16 still gives inf or NaN: applied, it was NaN weights for good.
    return flag if flag is not None else _all_finite(grads)


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
        scale, call = _scale_of_a_new_call()
        # A float16 loss with scale >= 65520 seeds inf: that step is skipped and the scale
        # halves. Multiplying in float32 would not help: the gradient of the float16 loss
        # itself (the backward Cast) is that same scale in float16.
        seed = tf.cast(scale, target.dtype) * _one_output_gradient(target, output_gradients)
        grads = original(self, target, sources, seed, unconnected_gradients)
        unscaled, finite = _unscaled(grads, scale)
        call.gradients = [g for g in tf.nest.flatten(unscaled) if g is not None]
        call.finite = finite
        _leave_pending(call)
        _STATE["scaled_any"] = True
        return unscaled

    gradient.__wrapped__ = original  # type: ignore[attr-defined]
    return gradient


def _scale_of_a_new_call() -> tuple[tf.Tensor, _Call]:
    """The scale a new gradient call uses, and its :class:`_Call`.

    Only gradients that an optimizer's ``apply`` checks may be scaled: a call whose gradients
    update the weights any other way (``w.assign_sub(lr * g)``, Sharpness-Aware
    Minimization's first step) has no step to skip, and an overflow at 2**15 reached the
    weights as inf. Nothing at the call says where its gradients go, so the scale starts at
    1: a traced call goes through an Identity that :func:`_consume` points at the loss scale
    when an ``apply`` later in the trace takes its gradients; an eager call is scaled when
    an ``apply`` took the gradients of an earlier call from the same line."""
    if tf.executing_eagerly():
        site = user_call_site(depth=3)
        if site in _STATE["eager_sites"]:
            return current_state().scale, _Call([], None, site=site, consumed=True)
        return tf.constant(1.0), _Call([], None, site=site)
    home = tf.compat.v1.get_default_graph()
    while upstream_tf.is_control_flow_graph(home) and home.outer_graph is not None:
        home = home.outer_graph
    # The switch lives in the function graph the call's loop bodies and branches are in: it
    # is still open to repointing when the apply after that loop or branch is built. Not
    # outside a nested tf.function: TensorFlow reuses its trace from other graphs, where a
    # tensor captured from this one is out of scope. The scale is read here, where the call
    # is: in a tf.range training loop, each step reads the scale the last step's apply left.
    with home.as_default():
        scaled = tf.identity(tf.constant(False), name="tf_amp_call_scaled")
        switched_on = tf.constant(True)
    scale = tf.where(scaled, state_variables()[0].read_value(), tf.constant(1.0))
    return scale, _Call([], None, selector=scaled.op, switched_on=switched_on)


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
            if _STATE["scaled_any"]:
                grads = list(grads)
                _take_pending(grads, consume=False)
            return original(self, grads, trainable_variables)
        grads = list(grads)
        finite = take_finite_flag(grads)
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
