"""``LossScaleCallback``: the loss scale and the skipped steps in ``fit``'s logs, and the floor
checks on the host for a train step XLA compiles."""

from __future__ import annotations

from typing import Any

import keras


class LossScaleCallback(keras.callbacks.Callback):
    """Adds ``loss_scale`` and ``skipped_steps`` to the epoch logs of ``fit``; for train steps
    XLA compiles, also warns and raises as the optimizer does in a step XLA does not compile.

    Place it before ``keras.callbacks.TensorBoard`` in the callback list and the two values are
    charted as ``epoch_loss_scale`` / ``epoch_skipped_steps``; they also land in ``History``.
    Reading the two scalars once per epoch is the only host sync it adds, unless the train
    step is compiled with XLA (``model.jit_compile``, which Keras turns on by itself on a GPU,
    or a ``train_step`` of your own under ``tf.function(jit_compile=True)``): XLA compiles no
    print or assert, so the step cannot say that the scale fell to its floor nor enforce
    ``max_consecutive_skips``; it counts those events instead, and this callback reads the
    counts after each batch (each execution, with ``steps_per_execution``) and says them
    (``optimizer.check_skips()``), in Keras's callback thread where Keras runs batch
    callbacks asynchronously.
    """

    # Reads one variable only, under a lock (check_skips). Run in Keras's callback threads,
    # its error reaches fit at the next batch or at the epoch's end: a batch or so late.
    async_safe = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # No host read until a step XLA compiled was traced (check_skips returns at once).
        optimizer = getattr(self.model, "optimizer", None)
        check_skips = getattr(optimizer, "check_skips", None)
        if check_skips is None and _applies_through_the_environment(optimizer):
            # A plain optimizer under TF_ENABLE_AUTO_MIXED_PRECISION, in a train_step of the
            # model's own: the environment's loss scale, not a wrapper, skipped its steps.
            from tf_amp.runtime import auto_loss_scale

            check_skips = auto_loss_scale.check_skips
        if check_skips is not None:
            check_skips()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if logs is None or not hasattr(optimizer, "loss_scale_metrics"):
            return
        for key, value in optimizer.loss_scale_metrics().items():
            logs[key] = float(value)


def _applies_through_the_environment(optimizer: Any) -> bool:
    """True for an optimizer whose steps the environment's custom-loop loss scale decides
    (``tf_amp.runtime.auto_loss_scale.attach_state`` marked it on its first scaled apply)."""
    return optimizer is not None and "_tf_amp_auto_state" in getattr(optimizer, "__dict__", {})
