"""``LossScaleCallback``: the loss scale and the skipped steps in ``fit``'s logs."""

from __future__ import annotations

from typing import Any

import keras


class LossScaleCallback(keras.callbacks.Callback):
    """Adds ``loss_scale`` and ``skipped_steps`` to the epoch logs of ``fit``.

    Place it before ``keras.callbacks.TensorBoard`` in the callback list and the two values are
    charted as ``epoch_loss_scale`` / ``epoch_skipped_steps``; they also land in ``History``.
    Reading the two scalars once per epoch is the only host sync it adds.
    """

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if logs is None or not hasattr(optimizer, "loss_scale_metrics"):
            return
        for key, value in optimizer.loss_scale_metrics().items():
            logs[key] = float(value)
