"""The "stuck at the floor" alarm: the loss scale cannot help any more, and the user must hear.

Printed from inside the graph (no host round trip on normal steps); shared by both wrappers and
the environment's custom-loop path through :mod:`tf_amp.optimizers._apply_or_skip`. XLA
compiles no print or assert op, so a step built with ``jit_compile`` gets no in-graph alarm:
the trace says so once, and :mod:`tf_amp.optimizers._host_floor_alarm` runs the same checks
on the host from the state variables after a step (``LossScaleCallback`` does that in
``fit``; custom loops call the wrapper's ``check_skips()``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import tensorflow as tf

from tf_amp._say_once import say_once
from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.ops import in_xla_context

CAUSES = (
    "Either a value in the step exceeds float16's range (max 65504) even unscaled "
    "(an overflow: inf, often turning into NaN further on), or the model, loss or "
    "data produce inf/NaN in float32 too. If the float32 step is finite on the same "
    "batch it is the first: keep the overflowing ops float32 (tf_amp.keep_float32, "
    "RewriteConfig(exclude_scopes=...)); otherwise check inputs, the learning rate, "
    "log/div/sqrt of values <= 0."
)
"""What is left to blame when steps are skipped with the scale at its floor."""



def fell_words(min_scale: float) -> tuple[str, str]:
    """The warning when a skip brings the scale down to its floor, around the skip count."""
    return (
        f"WARNING tf_amp: the loss scale fell to its floor {min_scale:g} after",
        "steps in a row were skipped for inf/NaN gradients; the steps were not applied. If "
        f"skips continue at the floor: {CAUSES}",
    )


def stuck_words(min_scale: float) -> tuple[str, str]:
    """The warning when steps keep being skipped at the floor, around the skip count."""
    return (
        f"WARNING tf_amp: the loss scale is at its floor {min_scale:g} and",
        "steps in a row were skipped there: gradients are inf/NaN with the loss not scaled "
        f"up. {CAUSES}",
    )


def too_many_skips(max_consecutive_skips: int) -> str:
    """The error after ``max_consecutive_skips`` skipped steps in a row."""
    return (
        f"tf_amp LossScaleOptimizer: {max_consecutive_skips} consecutive steps were "
        "skipped for inf/nan gradients (max_consecutive_skips); training is not "
        "making progress (if the scale sat at its floor: values beyond float16's "
        "range even unscaled, or an inf/NaN from the model, loss or data)."
    )


class FloorEvents:
    """What the alarm would have said in steps XLA compiled, counted inside them for the host.

    One int64 vector variable: how many times the scale fell to its floor, how many runs were
    stuck there ``floor_warning_skips`` steps, how many steps were skipped with
    ``max_consecutive_skips`` or more in a row, and the run length at the last fall (for the
    words). Counts only grow, so the host compares them with what it read last time and never
    writes them back: no race with steps that run while a check reads. Reading after any number
    of steps (``steps_per_execution``, a check every few steps) misses nothing in between.

    Not saved in checkpoints (a count of messages, not training state). ``armed`` is set when
    a step that updates the counts is traced: until then a check reads nothing and costs no
    host round trip.
    """

    FIELDS = ("fell", "stuck", "too_many", "fell_skips")

    def __init__(self) -> None:
        with tf.init_scope():
            self.counts = tf.Variable(
                tf.zeros([len(self.FIELDS)], tf.int64),
                name="loss_scale_floor_events",
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_WRITE,
                # every replica takes the same decisions (the finite flag is ANDed)
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        self.armed = False

    def record(self, fell: tf.Tensor, stuck: tf.Tensor, too_many: tf.Tensor,
               skips: tf.Tensor) -> Any:
        """The op adding this step's events (booleans) to the counts."""
        self.armed = True
        old = tf.convert_to_tensor(self.counts)
        added = tf.cast(tf.stack([fell, stuck, too_many]), tf.int64)
        fell_skips = tf.where(fell, tf.cast(skips, tf.int64), old[3])
        return self.counts.assign(
            tf.concat([old[:3] + added, [fell_skips]], axis=0), read_value=False
        )

    def read(self) -> dict[str, int]:
        """The counts now, by field (one host read)."""
        return dict(zip(self.FIELDS, (int(v) for v in self.counts.numpy()), strict=True))


def floor_alarm(
    policy: LossScale,
    state: LossScaleState,
    floor_warning_skips: int,
    max_consecutive_skips: int | None,
    previous: LossScaleState | None = None,
    events: FloorEvents | None = None,
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
    built (XLA compiles no print or assert ops; the trace logs that once, see the module
    docstring): the step adds what it would have said to ``events``, when given, for the
    wrapper's ``check_skips()`` on the host. Skipping itself is unaffected.
    """
    warns = policy.dynamic and floor_warning_skips > 0
    if in_xla_context():
        if not (warns or max_consecutive_skips):
            return None
        say_once(
            "floor checks under XLA",
            logging.WARNING,
            "this train step is compiled with XLA (jit_compile), which compiles "
            "no print or assert op, so the loss-scale floor warning and "
            "max_consecutive_skips are not checked inside it (steps with inf/NaN "
            "gradients are still skipped and counted). In Keras 3's fit, add "
            "tf_amp.LossScaleCallback() to the callbacks (also under "
            "TF_ENABLE_AUTO_MIXED_PRECISION): it checks both on the host "
            "after each batch; with a tf_amp LossScaleOptimizer in a custom loop, call "
            "its check_skips() after a step, or every few steps (what happened in between "
            "is counted)."
        )
        if events is None:
            return None
        false = tf.constant(False)
        fell = _fell(policy, state, previous) if warns else false
        stuck = tf.equal(state.floor_skips, floor_warning_skips) if warns else false
        too_many = (
            tf.greater_equal(state.consecutive_skips, max_consecutive_skips)
            if max_consecutive_skips else false
        )
        counted = events.record(fell, stuck, too_many, state.consecutive_skips)
        with tf.control_dependencies([counted]):
            return tf.constant(True)
    checks = []
    if warns:
        min_scale = getattr(policy, "min_scale", 1.0)
        fell_before, fell_after = fell_words(min_scale)
        stuck_before, stuck_after = stuck_words(min_scale)

        def printed_true(*parts: object) -> tf.Tensor:
            printed = tf.print(*parts, output_stream=sys.stderr)
            with tf.control_dependencies([printed] if printed is not None else []):
                return tf.constant(True)

        if previous is not None:
            fell = _fell(policy, state, previous)
            checks.append(
                tf.cond(
                    fell,
                    lambda: printed_true(fell_before, state.consecutive_skips, fell_after),
                    lambda: tf.constant(False),
                )
            )
        fire = tf.equal(state.floor_skips, floor_warning_skips)
        checks.append(
            tf.cond(
                fire,
                lambda: printed_true(stuck_before, state.floor_skips, stuck_after),
                lambda: tf.constant(False),
            )
        )
    if max_consecutive_skips:
        checks.append(
            tf.debugging.assert_less(
                state.consecutive_skips,
                tf.constant(max_consecutive_skips, tf.int64),
                message=too_many_skips(max_consecutive_skips),
            )
        )
    checks = [c for c in checks if c is not None]  # an eager assert returns None
    if not checks:
        return None
    with tf.control_dependencies(checks):
        return tf.constant(True)


def _fell(policy: LossScale, state: LossScaleState, previous: LossScaleState | None) -> tf.Tensor:
    """Whether this skip brought the scale down to its floor (False without a previous state)."""
    if previous is None:
        return tf.constant(False)
    floor = tf.constant(getattr(policy, "min_scale", 1.0), tf.float32)
    return tf.logical_and(
        tf.cast(previous.scale, tf.float32) > floor, tf.cast(state.scale, tf.float32) <= floor
    )
