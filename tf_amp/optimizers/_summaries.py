"""The loss scale and the skipped steps as ``tf.summary`` scalars (TensorBoard charts)."""

from __future__ import annotations

import numbers
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from tf_amp._upstream.tensorflow import has_default_summary_writer

SUMMARY_SCALE = "tf_amp/loss_scale"
SUMMARY_SKIPPED = "tf_amp/skipped_steps"


def write_summaries(scale: Any, skipped: Any, applied: Any = None, step: Any = None) -> None:
    """Writes the scale and skip count to the default ``tf.summary`` writer, if any.

    ``tf.summary.write`` is a trace-time no-op without a default writer, so this costs nothing
    unless the user opened one (``with writer.as_default():``, or Keras's TensorBoard callback).
    ``step``: where to write (the v1 wrapper's ``global_step``, as TF1's other summaries);
    without it, :func:`summary_step` of ``applied``, the inner optimizer's ``iterations``.
    """
    if not has_default_summary_writer():
        return  # nothing would be written: add no reads or casts to the step
    step = tf.cast(step, tf.int64) if step is not None else summary_step(applied, skipped)
    metadata = _scalar_metadata()
    tf.summary.write(SUMMARY_SCALE, tf.cast(scale, tf.float32), step=step, metadata=metadata)
    tf.summary.write(SUMMARY_SKIPPED, tf.cast(skipped, tf.float32), step=step, metadata=metadata)


def summary_step(applied: Any, skipped: Any) -> tf.Tensor:
    """The step the scale is written at: the user's default summary step, else every call.

    A step the user set (``tf.summary.experimental.set_step``, ``writer.as_default(step)``) puts
    the scale beside their own summaries, when it is a variable or tensor (read at run time),
    or when eager. A Python number set before a ``tf.function`` was traced would be frozen into
    the trace (Keras's TensorBoard callback pushes one), so it is not used there. Otherwise
    ``applied + skipped``, read after the step: each call of ``apply`` gets the next step,
    where ``iterations`` alone, which a skipped step leaves alone, wrote a skipped step at the
    same step as the applied one before it.
    """
    user = tf.summary.experimental.get_step()
    if user is not None and (tf.executing_eagerly() or not isinstance(user, numbers.Number)):
        return tf.cast(user, tf.int64)
    return tf.cast(applied, tf.int64) + tf.cast(skipped, tf.int64)


def _scalar_metadata() -> bytes:
    """TensorBoard scalar-plugin metadata, built here so TensorBoard need not be installed.

    ``tf.summary.scalar`` lives in the tensorboard package; the core ``tf.summary.write`` op
    plus this metadata produces the same event a TensorBoard scalar chart reads.
    """
    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    return metadata.SerializeToString()
