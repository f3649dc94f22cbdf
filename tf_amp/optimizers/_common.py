"""Pieces shared by the Keras and ``tf.compat.v1`` wrappers: misuse checks, the cross-replica
finite decision, and the "stuck at the floor" alarm.

They live here so both wrappers take the same decision the same way; nothing in this module
knows which optimizer family it serves.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, summary_pb2
from tensorflow.python.ops import summary_ops_v2

from tf_amp.config import local_device_type
from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.ops import in_xla_context

GRAPH_REWRITE_ATTR = "_tf_amp_graph_rewrite"
"""Attribute set to True on a wrapper returned by ``enable_mixed_precision_graph_rewrite``."""

FLOOR_WARNING_SKIPS = 2
"""Default of ``floor_warning_skips``: skips in a row at the floor before the warning prints."""

SUMMARY_SCALE = "tf_amp/loss_scale"
SUMMARY_SKIPPED = "tf_amp/skipped_steps"

SUPPORTED_MESSAGE = (
    "pass a Keras 3 optimizer (keras.optimizers.Adam(), ...), a tf_keras one "
    "(tf_keras.optimizers.Adam(), tf_keras.optimizers.legacy.Adam(), ...) or a "
    "tf.compat.v1.train.Optimizer (tf.compat.v1.train.AdamOptimizer(), ...)"
)


def is_tf_amp_wrapper(optimizer: Any) -> bool:
    """True for a tf_amp LossScaleOptimizer (Keras or v1), which marks its class so."""
    return bool(getattr(optimizer, "_tf_amp_loss_scale_wrapper", False))


def check_not_wrapped(inner: Any) -> None:
    """Raises a clear error for an optimizer that already scales the loss."""
    if is_tf_amp_wrapper(inner):
        raise ValueError(
            f"{type(inner).__name__} {getattr(inner, 'name', '')!r} is already a tf_amp "
            "LossScaleOptimizer; wrap the original optimizer once (its `inner_optimizer` is "
            "the unwrapped one), or use the wrapper you already have"
        )
    wrapper = wrapper_of(inner)
    if wrapper is not None:
        raise ValueError(
            f"{type(inner).__name__} {getattr(inner, 'name', '')!r} is already wrapped by the "
            f"tf_amp LossScaleOptimizer {getattr(wrapper, 'name', '')!r}: two wrappers would "
            "keep two loss scales and step the same optimizer state twice. Use the existing "
            "wrapper, or wrap a new optimizer (e.g. keras.optimizers.Adam.from_config("
            "opt.get_config()))"
        )
    keras_lso = _keras_loss_scale_optimizer_class()
    if keras_lso is not None and isinstance(inner, keras_lso):
        raise ValueError(
            "the optimizer is already a keras.optimizers.LossScaleOptimizer, which scales the "
            "loss itself; pass its `inner_optimizer` to tf_amp instead so the loss is scaled once"
        )


_WRAPPED_BY = "_tf_amp_wrapped_by"


def mark_wrapped(inner: Any, wrapper: Any) -> None:
    """Records (weakly) that ``wrapper`` wraps ``inner``, so a second wrapper is refused."""
    object.__setattr__(inner, _WRAPPED_BY, weakref.ref(wrapper))


def wrapper_of(inner: Any) -> Any:
    """The live tf_amp wrapper around ``inner``, or None."""
    ref = getattr(inner, _WRAPPED_BY, None)
    if ref is None or ref() is None:
        return None
    gc.collect()  # a dropped wrapper may only wait in a reference cycle: not a second wrapper
    return ref()


def _keras_loss_scale_optimizer_class() -> type | None:
    keras_module = sys.modules.get("keras")
    if keras_module is None:
        return None
    return getattr(keras_module.optimizers, "LossScaleOptimizer", None)


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


def floor_alarm(
    policy: LossScale,
    state: LossScaleState,
    floor_warning_skips: int,
    max_consecutive_skips: int | None,
    previous: LossScaleState | None = None,
) -> tf.Tensor | None:
    """Says when the scale falls to its floor and when it is stuck there; raises after too
    many skips in a row.

    ``state`` is the state after this skip, ``previous`` the one before it. Two messages, each
    printed once per run of skips, from inside the graph (no host round trip on normal steps):
    when a skip brings the scale down to its floor (with the default 2**15 that is the 15th
    skip in a row, so a run that then recovers, or stops, still hears of it), and when
    ``floor_warning_skips`` steps in a row were skipped *at* the floor. At the floor the loss
    is no longer scaled up, so the words cover both causes that remain, which one flag cannot
    tell apart: a value beyond float16's range even unscaled (inf, which often turns into NaN
    further on), or an inf/NaN the step would produce in float32 too. Returns a tensor to
    depend on, or None when there is nothing to check. Under ``jit_compile`` neither check is
    built (XLA compiles no print or assert ops); skipping itself is unaffected.
    """
    if in_xla_context():
        return None
    checks = []
    if policy.dynamic and floor_warning_skips > 0:
        min_scale = getattr(policy, "min_scale", 1.0)
        causes = (
            "Either a value in the step exceeds float16's range (max 65504) even unscaled "
            "(an overflow: inf, often turning into NaN further on), or the model, loss or "
            "data produce inf/NaN in float32 too. If the float32 step is finite on the same "
            "batch it is the first: keep the overflowing ops float32 (tf_amp.keep_float32, "
            "RewriteConfig(exclude_scopes=...)); otherwise check inputs, the learning rate, "
            "log/div/sqrt of values <= 0."
        )

        def warn_fell() -> tf.Tensor:
            printed = tf.print(
                "WARNING tf_amp: the loss scale fell to its floor",
                min_scale,
                "after",
                state.consecutive_skips,
                "steps in a row were skipped for inf/NaN gradients; the steps were not "
                "applied. If skips continue at the floor:",
                causes,
                output_stream=sys.stderr,
            )
            with tf.control_dependencies([printed] if printed is not None else []):
                return tf.constant(True)

        def warn_stuck() -> tf.Tensor:
            printed = tf.print(
                "WARNING tf_amp: the loss scale is at its floor",
                min_scale,
                "and",
                state.floor_skips,
                "steps in a row were skipped there: gradients are inf/NaN with the loss "
                "not scaled up.",
                causes,
                output_stream=sys.stderr,
            )
            with tf.control_dependencies([printed] if printed is not None else []):
                return tf.constant(True)

        if previous is not None:
            floor = tf.constant(min_scale, tf.float32)
            fell = tf.logical_and(
                tf.cast(previous.scale, tf.float32) > floor,
                tf.cast(state.scale, tf.float32) <= floor,
            )
            checks.append(tf.cond(fell, warn_fell, lambda: tf.constant(False)))
        fire = tf.equal(state.floor_skips, floor_warning_skips)
        checks.append(tf.cond(fire, warn_stuck, lambda: tf.constant(False)))
    if max_consecutive_skips:
        checks.append(
            tf.debugging.assert_less(
                state.consecutive_skips,
                tf.constant(max_consecutive_skips, tf.int64),
                message=(
                    f"tf_amp LossScaleOptimizer: {max_consecutive_skips} consecutive steps were "
                    "skipped for inf/nan gradients (max_consecutive_skips); training is not "
                    "making progress (if the scale sat at its floor: values beyond float16's "
                    "range even unscaled, or an inf/NaN from the model, loss or data)."
                ),
            )
        )
    if not checks:
        return None
    checks = [c for c in checks if c is not None]
    with tf.control_dependencies(checks):
        return tf.constant(True)


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
) -> tf.Tensor:
    """One ``tf.cond``: apply the inner optimizer and ``after_finite``, or ``after_skip``.

    Each branch reads the state itself, does only its own half of the update, and writes only
    the fields that changed (the policy returns unchanged fields as the very tensors read).
    The floor alarm lives in the skip branch. So a finite step costs one ``If``, the inner
    update and a few scalar ops, and the cond captures no extra tensors. Every write waits for
    every read, which orders them even in a TF1 graph (no automatic control dependencies).
    Returns the cond's boolean output (true when applied) to hang dependencies on.
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
            policy, new, floor_warning_skips, max_consecutive_skips, previous=state
        )
        if alarm is not None:
            deps.append(alarm)
        with tf.control_dependencies(deps):
            return tf.constant(False)

    applied = tf.cond(finite, on_finite, on_skip)
    _keep_as_function_call(applied)
    return applied


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
    """
    if tf.executing_eagerly() or tf.distribute.has_strategy():
        return  # eagerly the cond has already run: no op to mark
    if local_device_type() == "GPU":
        return
    op = cond_output.op
    if op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    if op.type in ("If", "StatelessIf"):
        op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))


def apply_if_finite(
    finite: tf.Tensor,
    inner_apply: Callable[[Any, Any], Any],
    grads: Any,
    variables: Any,
    policy: LossScale,
    state_variables: Sequence[Any],
    floor_warning_skips: int,
    max_consecutive_skips: int | None,
) -> tf.Tensor | None:
    """``apply_or_skip`` of ``inner_apply(grads, variables)``, from a replica context too.

    Call it with ``finite`` already ANDed over replicas (``all_replicas_finite``). Strategies
    that need ``merge_call`` (MirroredStrategy) cannot run a cond whose branch merges in a
    replica context (the inner optimizer's gradient all-reduce), so there the cond runs in the
    cross-replica context and calls back into each replica, as Keras does. ``finite`` is
    identical on all replicas, so taking the first local value is exact. Returns the cond's
    output, or None on the ``merge_call`` path (nothing to depend on in the replica context).
    """
    if tf.__internal__.distribute.strategy_supports_no_merge_call():
        return apply_or_skip(
            finite,
            lambda: inner_apply(grads, variables),
            policy,
            state_variables,
            floor_warning_skips,
            max_consecutive_skips,
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
        )

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(finite, grads, variables))
    return None


def write_summaries(scale: Any, skipped: Any, step: Any) -> None:
    """Writes the scale and skip count to the default ``tf.summary`` writer, if any.

    ``tf.summary.write`` is a trace-time no-op without a default writer, so this costs nothing
    unless the user opened one (``with writer.as_default():``, or Keras's TensorBoard callback).
    """
    if not summary_ops_v2.has_default_writer():
        return  # nothing would be written: add no reads or casts to the step
    step = tf.cast(step, tf.int64)
    metadata = _scalar_metadata()
    tf.summary.write(SUMMARY_SCALE, tf.cast(scale, tf.float32), step=step, metadata=metadata)
    tf.summary.write(SUMMARY_SKIPPED, tf.cast(skipped, tf.float32), step=step, metadata=metadata)


def _scalar_metadata() -> bytes:
    """TensorBoard scalar-plugin metadata, built here so TensorBoard need not be installed.

    ``tf.summary.scalar`` lives in the tensorboard package; the core ``tf.summary.write`` op
    plus this metadata produces the same event a TensorBoard scalar chart reads.
    """
    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    return metadata.SerializeToString()
