"""The tf_amp wrapper around a current ``tf_keras.optimizers.Optimizer`` (``Adam``, ``SGD``...).

Its own module because its ``minimize`` / ``apply_gradients`` follow the current tf_keras
optimizer's signatures (``skip_gradients_aggregation``, ``apply_gradients`` returning
``iterations``), which the legacy ``OptimizerV2`` wrapper
(:mod:`tf_amp.optimizers._tf_keras_legacy`) does not share; the step itself is
:mod:`tf_amp.optimizers._tf_keras_scaling`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp._upstream import tf_keras as upstream
from tf_amp.optimizers import _common
from tf_amp.optimizers._tf_keras_scaling import TfKerasLossScaling

# tf_keras's LossScaleOptimizerV3: the base that makes compile see a loss-scale optimizer
_LSO_V3 = upstream.loss_scale_optimizer_classes()[1]


class TfKerasLossScaleOptimizer(TfKerasLossScaling, _LSO_V3):
    """Loss scaling around a ``tf_keras.optimizers.Optimizer`` (``tf_keras.optimizers.Adam``...).

    Args:
      inner_optimizer: the tf_keras optimizer that applies the unscaled gradients (clipping,
        weight decay and EMA stay on it and act on unscaled gradients).
      loss_scale: ``"dynamic"`` (default), a number (static) or a ``tf_amp.LossScale``; or
        tf_keras's ``dynamic=``, ``initial_scale=``, ``dynamic_growth_steps=``.
      enabled: ``False`` makes the wrapper a pass-through (scale 1, no check, no skipping).
      floor_warning_skips: warn after this many skips in a row at the floor (0: never).
      max_consecutive_skips: raise after this many consecutive skips (None: never).
      name: the wrapper's name.
    """

    @upstream_tf.no_automatic_dependency_tracking
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

    def minimize(self, loss: Any, var_list: Any, tape: Any = None) -> Any:
        """Scales ``loss``, and applies its gradients with one fused unscale-and-check."""
        return self.apply_gradients(self._scaled_grads_and_vars(loss, var_list, tape))

    def apply_gradients(
        self,
        grads_and_vars: Iterable[Any],
        name: str | None = None,
        skip_gradients_aggregation: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Applies the gradients if all are finite (on every replica), else skips the step."""
        aggregate = kwargs.pop("experimental_aggregate_gradients", True)
        inner_kwargs = {
            "name": name,
            "skip_gradients_aggregation": skip_gradients_aggregation or not aggregate,
        }
        self._apply_scaled(grads_and_vars, inner_kwargs)
        return self.iterations


TfKerasLossScaleOptimizer = upstream.register_serializable(TfKerasLossScaleOptimizer)
