"""The loss scale and the skipped steps as ``tf.summary`` scalars (TensorBoard charts)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from tf_amp._upstream.tensorflow import has_default_summary_writer

SUMMARY_SCALE = "tf_amp/loss_scale"
SUMMARY_SKIPPED = "tf_amp/skipped_steps"


def write_summaries(scale: Any, skipped: Any, step: Any) -> None:
    """Writes the scale and skip count to the default ``tf.summary`` writer, if any.

    ``tf.summary.write`` is a trace-time no-op without a default writer, so this costs nothing
    unless the user opened one (``with writer.as_default():``, or Keras's TensorBoard callback).
    """
    if not has_default_summary_writer():
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
