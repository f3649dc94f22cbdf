"""The Keras wrapper's arguments and the attributes that belong to its inner optimizer.

Constructor arguments are checked and the legacy names accepted; errors name the argument and
say what to do instead (most often: set it on the inner optimizer, which receives the unscaled
gradients). The inner optimizer's learning rate, step counter, clipping, decay and averaging
are read and set through the wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from tf_amp import loss_scale as loss_scale_lib
from tf_amp.optimizers import _common

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
    if max_consecutive_skips is not None and max_consecutive_skips < 1:
        raise ValueError(
            f"max_consecutive_skips must be None or >= 1, got {max_consecutive_skips}"
        )
    return loss_scale


def legacy_loss_scale(loss_scale: Any, kwargs: dict[str, Any]) -> Any:
    """Accepts the argument names of ``tf.keras.mixed_precision.LossScaleOptimizer`` (TF2) and
    ``keras.optimizers.LossScaleOptimizer``: ``dynamic``, ``initial_scale``,
    ``dynamic_growth_steps``, so code written for them can switch by changing the class."""
    legacy = {
        k: kwargs.pop(k)
        for k in ("dynamic", "initial_scale", "dynamic_growth_steps")
        if k in kwargs
    }
    if not legacy:
        return loss_scale
    if not isinstance(legacy.get("dynamic", True), bool):
        raise TypeError(
            f"dynamic must be True or False, got {legacy['dynamic']!r}; for a dynamic scale "
            "pass dynamic=True (or loss_scale=\"dynamic\"), for a fixed one dynamic=False "
            "with initial_scale=..."
        )
    if loss_scale != "dynamic":
        raise ValueError(
            f"pass either loss_scale or {sorted(legacy)}, not both (got loss_scale={loss_scale!r})"
        )
    if legacy.get("dynamic", True):
        return loss_scale_lib.DynamicLossScale(
            initial_scale=_or_default(legacy.get("initial_scale"), 2.0**15),
            growth_interval=_or_default(legacy.get("dynamic_growth_steps"), 2000),
        )
    if legacy.get("dynamic_growth_steps") is not None:
        raise ValueError("dynamic_growth_steps has no meaning with dynamic=False")
    return loss_scale_lib.StaticLossScale(_or_default(legacy.get("initial_scale"), 2.0**15))


def _or_default(value: Any, default: Any) -> Any:
    """TF2's signature defaults these arguments to None, meaning "the default"."""
    return default if value is None else value


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
