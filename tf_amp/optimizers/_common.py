"""Pieces shared by the Keras and ``tf.compat.v1`` wrappers: which optimizer is wrapped by
which, and the misuse checks that follow from it.

The step itself (the cross-replica finite decision, apply or skip, the floor alarm, the
summaries) is shared too, in :mod:`tf_amp.optimizers._apply_or_skip`,
:mod:`tf_amp.optimizers._floor_alarm` and :mod:`tf_amp.optimizers._summaries`; nothing in these
modules knows which optimizer family it serves.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import weakref
from collections.abc import Iterator
from typing import Any

FLOOR_WARNING_SKIPS = 2
"""Default of ``floor_warning_skips``: skips in a row at the floor before the warning prints."""


def checked_skip_limits(
    floor_warning_skips: Any, max_consecutive_skips: Any
) -> tuple[int, int | None]:
    """The two skip counts every wrapper takes, checked as the int64 counters they are compared
    with: a string, a fraction or a count below 1 was taken and then failed (or never fired)
    at the first step. ``floor_warning_skips=0`` turns the floor warning off, as documented."""
    from tf_amp.loss_scale._base import checked_count

    floor = checked_count(floor_warning_skips, "floor_warning_skips (0: never warn)", minimum=0)
    if max_consecutive_skips is None:
        return floor, None
    return floor, checked_count(max_consecutive_skips, "max_consecutive_skips (or None)")


SUPPORTED_MESSAGE = (
    "pass a Keras 3 optimizer (keras.optimizers.Adam(), ...), a tf_keras one "
    "(tf_keras.optimizers.Adam(), tf_keras.optimizers.legacy.Adam(), ...) or a "
    "tf.compat.v1.train.Optimizer (tf.compat.v1.train.AdamOptimizer(), ...)"
)


def is_tf_amp_wrapper(optimizer: Any) -> bool:
    """True for a tf_amp LossScaleOptimizer (Keras or v1), which marks its class so."""
    return bool(getattr(optimizer, "_tf_amp_loss_scale_wrapper", False))


def check_not_wrapped(inner: Any) -> None:
    """Raises a clear error for an optimizer that already scales the loss."""
    if is_tf_amp_wrapper(inner):
        raise ValueError(
            f"{type(inner).__name__} {getattr(inner, 'name', '')!r} is already a tf_amp "
            "LossScaleOptimizer; wrap the original optimizer once (its `inner_optimizer` is "
            "the unwrapped one), or use the wrapper you already have"
        )
    wrapper = wrapper_of(inner)
    if wrapper is not None:
        raise ValueError(
            f"{type(inner).__name__} {getattr(inner, 'name', '')!r} is already wrapped by the "
            f"tf_amp LossScaleOptimizer {getattr(wrapper, 'name', '')!r}: two wrappers would "
            "keep two loss scales and step the same optimizer state twice. Use the existing "
            "wrapper, or wrap a new optimizer (e.g. keras.optimizers.Adam.from_config("
            "opt.get_config()))"
        )
    keras_lso = _keras_loss_scale_optimizer_class()
    if keras_lso is not None and isinstance(inner, keras_lso):
        raise ValueError(
            "the optimizer is already a keras.optimizers.LossScaleOptimizer, which scales the "
            "loss itself; pass its `inner_optimizer` to tf_amp instead so the loss is scaled once"
        )
    tf_v1_lso = _tf_v1_loss_scale_optimizer_class()
    if tf_v1_lso is not None and isinstance(inner, tf_v1_lso):
        raise ValueError(
            "the optimizer is already a tf.compat.v1.mixed_precision."
            "MixedPrecisionLossScaleOptimizer, which scales the loss itself (the two scales "
            "would multiply, and the gradients overflow); pass the optimizer you gave it to "
            "tf_amp instead so the loss is scaled once"
        )


def _tf_v1_loss_scale_optimizer_class() -> type | None:
    """TensorFlow's TF1 loss-scale wrapper (what its own enable_mixed_precision_graph_rewrite
    returns), when TensorFlow is loaded."""
    tf = sys.modules.get("tensorflow")
    mixed_precision = getattr(getattr(tf, "compat", None), "v1", None)
    mixed_precision = getattr(mixed_precision, "mixed_precision", None)
    return getattr(mixed_precision, "MixedPrecisionLossScaleOptimizer", None)


_WRAPPED_BY = "_tf_amp_wrapped_by"


def mark_wrapped(inner: Any, wrapper: Any) -> None:
    """Records (weakly) that ``wrapper`` wraps ``inner``, so a second wrapper is refused."""
    object.__setattr__(inner, _WRAPPED_BY, weakref.ref(wrapper))


def wrapper_of(inner: Any) -> Any:
    """The live tf_amp wrapper around ``inner``, or None."""
    ref = getattr(inner, _WRAPPED_BY, None)
    if ref is None or ref() is None:
        return None
    gc.collect()  # a dropped wrapper may only wait in a reference cycle: not a second wrapper
    return ref()


def _keras_loss_scale_optimizer_class() -> type | None:
    keras_module = sys.modules.get("keras")
    if keras_module is None:
        return None
    return getattr(keras_module.optimizers, "LossScaleOptimizer", None)


@contextlib.contextmanager
def holding_inner_optimizer(model: Any) -> Iterator[None]:
    """While saving: ``model.optimizer`` is the inner optimizer of the ``saves_as_inner``
    wrapper the environment put around the script's own, so the file names that optimizer,
    as a float32 run's does, not tf_amp's wrapper (which a process without tf_amp cannot
    load). Set with ``object.__setattr__``: no re-tracking. tf_keras's ``.keras`` files
    store the compile config, which holds the optimizer too: it is swapped as well."""
    optimizer = getattr(model, "optimizer", None)
    if not getattr(optimizer, "saves_as_inner", False):
        yield
        return
    inner = optimizer.inner_optimizer
    compile_config = model.__dict__.get("_compile_config")
    swap_config = compile_config is not None and getattr(
        compile_config, "config", {}).get("optimizer") is optimizer
    object.__setattr__(model, "optimizer", inner)
    if swap_config:
        swapped = type(compile_config)(**dict(compile_config.config, optimizer=inner))
        object.__setattr__(model, "_compile_config", swapped)
    try:
        yield
    finally:
        object.__setattr__(model, "optimizer", optimizer)
        if swap_config:
            object.__setattr__(model, "_compile_config", compile_config)
