"""The "stuck at the floor" alarm: the loss scale cannot help any more, and the user must hear.

Printed from inside the graph (no host round trip on normal steps); shared by both wrappers and
the environment's custom-loop path through :mod:`tf_amp.optimizers._apply_or_skip`.
"""

from __future__ import annotations

import sys

import tensorflow as tf

from tf_amp.loss_scale import LossScale, LossScaleState
from tf_amp.ops import in_xla_context


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
