"""The tf_amp wrapper around a legacy ``tf_keras.optimizers.legacy.Optimizer`` (``OptimizerV2``).

Its own module because ``OptimizerV2``'s API differs from the current optimizer's:
``minimize`` takes ``grad_loss`` and ``name``, ``apply_gradients`` takes
``experimental_aggregate_gradients`` and returns an op, and its slots are created by
``_create_all_weights`` (see :mod:`tf_amp._upstream.tf_keras`). The shared step is
:mod:`tf_amp.optimizers._tf_keras_scaling`'s; the flag ``_legacy`` selects the legacy calls there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from tf_amp._upstream import tf_keras as upstream
from tf_amp.optimizers import _common
from tf_amp.optimizers._tf_keras_scaling import TfKerasLossScaling

# tf_keras's legacy LossScaleOptimizer: the base that makes compile see a loss-scale optimizer
_LSO_LEGACY = upstream.loss_scale_optimizer_classes()[2]


class TfKerasLegacyLossScaleOptimizer(TfKerasLossScaling, _LSO_LEGACY):
    """Loss scaling around a ``tf_keras.optimizers.legacy.Optimizer`` (``OptimizerV2``).

    Arguments as for :class:`TfKerasLossScaleOptimizer`. Hyperparameters (``learning_rate``,
    ``beta_1``...) read and set through the wrapper act on the inner optimizer, as in tf.keras
    2.x.
    """

    _legacy = True

    def __init__(
        self,
        inner_optimizer: Any,
        loss_scale: Any = "dynamic",
        enabled: bool = True,
        floor_warning_skips: int = _common.FLOOR_WARNING_SKIPS,
        max_consecutive_skips: int | None = None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._init_scaling(
            inner_optimizer, loss_scale, enabled, floor_warning_skips, max_consecutive_skips,
            name, kwargs,
        )

    def minimize(
        self, loss: Any, var_list: Any, grad_loss: Any = None, name: str | None = None,
        tape: Any = None,
    ) -> Any:
        """Scales ``loss``, and applies its gradients with one fused unscale-and-check."""
        grads_and_vars = self._scaled_grads_and_vars(loss, var_list, tape, grad_loss)
        return self.apply_gradients(grads_and_vars, name=name)

    def apply_gradients(
        self,
        grads_and_vars: Iterable[Any],
        name: str | None = None,
        experimental_aggregate_gradients: bool = True,
    ) -> Any:
        """Applies the gradients if all are finite (on every replica), else skips the step."""
        done = self._apply_scaled(
            grads_and_vars,
            {"name": name, "experimental_aggregate_gradients": experimental_aggregate_gradients},
        )
        return tf.group(*([done] if done is not None else []))


TfKerasLegacyLossScaleOptimizer = upstream.register_serializable(TfKerasLegacyLossScaleOptimizer)
