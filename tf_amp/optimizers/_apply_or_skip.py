"""One step of loss scaling: decide across replicas, then apply the inner optimizer or skip.

A skipped step changes nothing (weights, slots, iteration counters); either branch moves the
loss-scale state with the policy (``tf_amp.loss_scale``). Shared by the Keras and v1 wrappers
and the environment's custom-loop path, so all take the same decision the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tf_amp._upstream.tensorflow import strategy_supports_no_merge_call
from tf_amp.config import local_device_type
from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.optimizers._floor_alarm import FloorEvents, floor_alarm


def all_replicas_finite(finite: tf.Tensor) -> tf.Tensor:
    """ANDs the finite flag over all replicas (in a replica context), so all decide alike.

    Gradients are reduced across replicas only inside the inner optimizer, after our decision,
    so each replica's local flag can differ: one replica with an inf must skip everyone's step.
    """
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return finite
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return finite
    # Reduced as a [1] vector, never as a scalar. Inside a tf.function a strategy flattens
    # every all-reduce to rank 1 (it packs them), eagerly it sends the tensor as it is; two
    # MirroredStrategy objects of one process reuse collective instance keys, so a scalar
    # reduced eagerly under one and in a function under the next is the same collective
    # instance with two shapes, and TensorFlow aborts every later collective of the process.
    bad = context.all_reduce(
        tf.distribute.ReduceOp.SUM, tf.reshape(tf.cast(~finite, tf.float32), [1])
    )
    return tf.equal(tf.reshape(bad, []), 0.0)


def read_state(variables: Sequence[Any]) -> LossScaleState:
    """Reads every state variable once (one read per field, shared by all its uses)."""
    return LossScaleState(*(tf.convert_to_tensor(v) for v in variables))


def apply_or_skip(
    finite: tf.Tensor,
    apply_inner: Callable[[], Any],
    policy: LossScale,
    variables: Sequence[Any],
    floor_warning_skips: int,
    max_consecutive_skips: int | None,
    events: FloorEvents | None = None,
    distributed: bool = False,
) -> tf.Tensor:
    """One ``tf.cond``: apply the inner optimizer and ``after_finite``, or ``after_skip``.

    Each branch reads the state itself, does only its own half of the update, and writes only
    the fields that changed (the policy returns unchanged fields as the very tensors read).
    The floor alarm lives in the skip branch. So a finite step costs one ``If``, the inner
    update and a few scalar ops, and the cond captures no extra tensors. Every write waits for
    every read, which orders them even in a TF1 graph (no automatic control dependencies).
    Returns the cond's boolean output (true when applied) to hang dependencies on.
    ``distributed``: the inner update writes a strategy's variables (the cond stays lowered).
    """

    def write(state: LossScaleState, new: LossScaleState) -> list[Any]:
        ops = []
        with tf.control_dependencies(list(state)):
            for variable, value, old in zip(variables, new, state, strict=True):
                if value is not old:
                    ops.append(variable.assign(tf.cast(value, variable.dtype), read_value=False))
        return [op for op in ops if op is not None]

    def on_finite() -> tf.Tensor:
        applied = apply_inner()
        state = read_state(variables)
        deps = write(state, policy.after_finite(state))
        if applied is not None:
            deps.append(applied)
        with tf.control_dependencies(deps):
            return tf.constant(True)

    def on_skip() -> tf.Tensor:
        state = read_state(variables)
        new = policy.after_skip(state)
        deps = write(state, new)
        alarm = floor_alarm(
            policy, new, floor_warning_skips, max_consecutive_skips, previous=state,
            events=events,
        )
        if alarm is not None:
            deps.append(alarm)
        with tf.control_dependencies(deps):
            return tf.constant(False)

    with _global_graph_as_outer_context(), _branch_items_kept_out_of_collections():
        applied = tf.cond(finite, on_finite, on_skip)
    if not distributed:
        _keep_as_function_call(applied)
    return applied


def any_distributed(variables: Sequence[Any]) -> bool:
    """Whether a variable of ``variables`` (Keras's or TensorFlow's) is a strategy's: applied
    outside the strategy's scope (gradients reduced after ``strategy.run``), its cond must be
    lowered all the same, or its components' devices cannot be placed."""
    distributed = tf.distribute.DistributedValues
    return any(
        isinstance(v, distributed) or isinstance(getattr(v, "_value", None), distributed)
        for v in variables
    )


@contextlib.contextmanager
def _branch_items_kept_out_of_collections() -> Any:
    """Removes from the outer graph's collections what the cond's branches added to them.

    A branch's graph shares its outer graph's collections, and TF1's ``apply_gradients``
    appends its update op to ``GraphKeys.TRAIN_OP``: an op of the branch, which is not in the
    outer graph, so ``export_meta_graph`` wrote a collection naming an op the graph lacks and
    ``import_meta_graph`` (and a TF1 SavedModel's load) failed with a KeyError. The v1
    wrapper adds its own op there instead, as TF1's optimizers do.
    """
    if tf.executing_eagerly():
        yield
        return
    graph = tf.compat.v1.get_default_graph()
    before = {key: len(graph.get_collection_ref(key)) for key in graph.get_all_collection_keys()}
    yield
    for key in graph.get_all_collection_keys():
        items = graph.get_collection_ref(key)
        start = before.get(key, 0)
        items[start:] = [item for item in items[start:] if getattr(item, "graph", graph) is graph]


def _global_graph_as_outer_context() -> Any:
    """Makes a TF1 script's implicit global graph the context ``init_scope`` lifts to from
    inside the cond's branches.

    The inner optimizer makes state there on first use (TF1 Adam's ``beta1_power``, under
    ``init_scope``). With no graph entered explicitly, ``init_scope`` lifts to the innermost
    context on TensorFlow's context-switch stack that builds no function; once the eager
    context was made before ``disable_eager_execution()`` (the environment's device query, or
    a script's own ``tf.config.list_physical_devices``), that is the eager one: the variable
    was made eagerly and the branch failed with "Attempting to capture an EagerTensor without
    building a function". Entering the graph puts it on that stack, above the eager entry.
    """
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    graph = tf.compat.v1.get_default_graph()
    return contextlib.nullcontext() if graph.building_function else graph.as_default()


def _keep_as_function_call(cond_output: tf.Tensor) -> None:
    """Marks the ``If`` behind ``cond_output`` to run as one function call, not be lowered.

    TensorFlow lowers a control-flow-v2 ``If`` to a ``Switch`` per captured input (here every
    gradient, variable and slot handle: 268 on a ResNet-20) plus ``Merge``s, which costs more
    per step than one call of the branch function: ``optimizer.apply`` alone on a ResNet-20
    (65 gradients, one thread, same run) cost +207 us over plain Adam lowered and +79 us as a
    call (``bench/step_overhead.py``). Only in a CPU-only process without a distribution
    strategy: TensorFlow's ``If`` kernel runs its branch as a function on the If's own device,
    so with a GPU (variables there, the floor alarm's print on the host) or a strategy
    (collectives, several devices) the branch needs the lowered form, which places each op on
    its own; that form is also the one tested on GPUs, which this project has not run on. A v1
    ``cond`` (Switch/Merge already) is left alone.

    Only for a small update (:data:`CALL_AT_MOST_BYTES` of gradients, or fewer): a call holds
    every input, each gradient included, until the whole branch is done, where the lowered
    form frees a gradient once its variable's update has read it. On 25M parameters (100 MB of
    float32 gradients, Adam) the call added 40-80 MB to the step's peak memory, for a saving
    of well under 1% of such a step's time.
    """
    if tf.executing_eagerly() or tf.distribute.has_strategy():
        return  # eagerly the cond has already run: no op to mark
    if local_device_type() == "GPU":
        return
    op = cond_output.op
    if op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    if op.type not in ("If", "StatelessIf") or _input_bytes(op) > CALL_AT_MOST_BYTES:
        return
    op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))


CALL_AT_MOST_BYTES = 16 << 20
"""The largest update (bytes of the apply-or-skip ``If``'s tensor inputs: the gradients) kept
as one function call on a CPU (see :func:`_keep_as_function_call`)."""


def _input_bytes(op: tf.Operation) -> int:
    """Bytes of ``op``'s numeric inputs (resource handles count nothing); one whose shape is
    not fully known counts as over any limit (its size is not bounded)."""
    total = 0
    for tensor in op.inputs:
        if tensor.dtype in (tf.resource, tf.variant, tf.string):
            continue
        if not tensor.shape.is_fully_defined():
            return 1 << 62
        total += tensor.shape.num_elements() * tensor.dtype.size
    return total


class KeepWhole:
    """Carries a variable list through ``merge_call`` / ``call_for_each_replica`` untouched.

    A strategy hands each replica its own component of a mirrored *variable* passed as an
    argument; an inner optimizer applied from :func:`apply_if_finite`'s cross-replica path must
    get the mirrored variables themselves (tf_keras's wrapper does the same with its
    ``_UnwrapPreventer``). Used by the tf_keras wrappers and the tf_keras environment patch.
    """

    def __init__(self, value: list[Any]) -> None:
        self.value = value


def apply_if_finite(
    finite: tf.Tensor,
    inner_apply: Callable[[Any, Any], Any],
    grads: Any,
    variables: Any,
    policy: LossScale,
    state_variables: Sequence[Any],
    floor_warning_skips: int,
    max_consecutive_skips: int | None,
    events: FloorEvents | None = None,
) -> tf.Tensor | None:
    """``apply_or_skip`` of ``inner_apply(grads, variables)``, from a replica context too.

    ``events`` (the wrapper's, for ``check_skips()``) counts what the floor alarm would say
    in a step XLA compiles.

    Call it with ``finite`` already ANDed over replicas (``all_replicas_finite``). Strategies
    that need ``merge_call`` (MirroredStrategy) cannot run a cond whose branch merges in a
    replica context (the inner optimizer's gradient all-reduce), so there the cond runs in the
    cross-replica context and calls back into each replica, as Keras does. ``finite`` is
    identical on all replicas, so taking the first local value is exact. Returns the cond's
    output, or None on the ``merge_call`` path (nothing to depend on in the replica context).
    """
    if strategy_supports_no_merge_call():
        written = variables.value if isinstance(variables, KeepWhole) else variables
        return apply_or_skip(
            finite,
            lambda: inner_apply(grads, variables),
            policy,
            state_variables,
            floor_warning_skips,
            max_consecutive_skips,
            events,
            distributed=any_distributed([*(written or ()), *state_variables]),
        )

    def cross_replica(distribution: Any, finite: Any, grads: Any, variables: Any) -> None:
        first = distribution.experimental_local_results(finite)[0]

        def apply_each() -> None:
            distribution.extended.call_for_each_replica(inner_apply, args=(grads, variables))

        apply_or_skip(
            first,
            apply_each,
            policy,
            state_variables,
            floor_warning_skips,
            max_consecutive_skips,
            events,
        )

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(finite, grads, variables))
    return None
