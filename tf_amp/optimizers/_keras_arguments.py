"""The Keras wrapper's arguments and the attributes that belong to its inner optimizer.

Constructor arguments are checked and the legacy names accepted (read by
:mod:`tf_amp.optimizers._legacy_scale_args`, shared with the tf_keras wrappers); errors name the
argument and
say what to do instead (most often: set it on the inner optimizer, which receives the unscaled
gradients). The inner optimizer's learning rate, step counter, clipping, decay and averaging
are read and set through the wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from tf_amp.optimizers import _common
from tf_amp.optimizers._legacy_scale_args import legacy_loss_scale

# Base-optimizer arguments that belong on the inner optimizer, not on the wrapper.
INNER_ONLY_ARGS = {
    "learning_rate": None,
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def check_arguments(
    inner_optimizer: Any, loss_scale: Any, max_consecutive_skips: int | None, kwargs: dict
) -> Any:
    """Raises a clear error for an argument the wrapper cannot take; returns the loss scale
    (``loss_scale``, or the policy the legacy arguments in ``kwargs`` describe)."""
    _common.check_not_wrapped(inner_optimizer)
    if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"KerasLossScaleOptimizer wraps a keras.optimizers.Optimizer, got "
            f"{type(inner_optimizer).__name__}; {_common.SUPPORTED_MESSAGE}"
        )
    loss_scale = legacy_loss_scale(loss_scale, kwargs)
    for arg, default in INNER_ONLY_ARGS.items():
        if arg in kwargs and kwargs.pop(arg) != default:
            raise ValueError(
                f"LossScaleOptimizer does not take `{arg}`; set `{arg}` on the inner "
                "optimizer, which receives the unscaled gradients"
            )
    if kwargs:
        raise TypeError(f"LossScaleOptimizer got unexpected arguments: {sorted(kwargs)}")
    if inner_optimizer.loss_scale_factor is not None:
        raise ValueError(
            f"the inner optimizer has loss_scale_factor={inner_optimizer.loss_scale_factor}, "
            "which would scale the loss a second time; create it without "
            "loss_scale_factor and pass loss_scale="
            f"{inner_optimizer.loss_scale_factor} to LossScaleOptimizer instead"
        )
    return loss_scale


# Base-optimizer attributes read and set through the wrapper on its inner optimizer.
FORWARDED_ATTRIBUTES = (
    "clipnorm",
    "global_clipnorm",
    "clipvalue",
    "use_ema",
    "ema_momentum",
    "ema_overwrite_frequency",
    "weight_decay",
    "gradient_accumulation_steps",
)

def forwarded(name: str) -> property:
    """An attribute of the inner optimizer, read and set through the wrapper (tf.keras 2.x
    forwarded these too): the inner optimizer is the one that clips, decays and averages."""

    def get(self: Any) -> Any:
        inner = self.__dict__.get("inner_optimizer")
        return None if inner is None else getattr(inner, name)

    def set_(self: Any, value: Any) -> None:
        inner = self.__dict__.get("inner_optimizer")
        if inner is not None:  # Keras's base __init__ sets its defaults before inner exists
            setattr(inner, name, value)

    return property(get, set_, doc=f"The inner optimizer's ``{name}``.")


class DelegatesToInner:
    """Mixin of the Keras wrapper: what the inner optimizer owns, reached through the wrapper."""

    inner_optimizer: Any

    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate: Any) -> None:
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self) -> Any:
        return self.inner_optimizer.iterations

    def finalize_variable_values(self, var_list: Sequence[Any]) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    def exclude_from_weight_decay(
        self, var_list: Sequence[Any] | None = None, var_names: Sequence[str] | None = None
    ) -> None:
        """Excludes variables from the inner optimizer's weight decay: it is the one that
        decays (Keras's base method would record them on the wrapper, where nothing reads
        them, and the inner AdamW would go on decaying them)."""
        self.inner_optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)
