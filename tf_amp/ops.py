"""Python binding of the fused ``TfAmpUnscaleAndCheckFinite`` op, with a pure-TF fallback.

Why a native op: the loss-scaling step must unscale every gradient and learn whether all of
them are finite. Keras and ``tf.compat.v1`` do that with two or three small ops per gradient
plus a stack (hundreds of ops for a ResNet, each with ~12 µs of fixed cost, and each re-reading
the gradient from memory). The native op reads every element once, writes the unscaled value in
place when TensorFlow lets it reuse the input buffer, and yields one scalar flag.

If the shared library was not built, or fails to load (for example it was built against another
TensorFlow), the same function runs on plain TF ops and warns once, saying why.

Arithmetic contract (identical on every path, so results are bit-comparable):
  * float32:           ``g * (1 / scale)``                     (product in float32)
  * float64:           ``g * (1 / float64(scale))``            (product in float64)
  * float16, bfloat16: ``cast(float32(g) * (1 / scale), dtype)`` (product in float32, rounded once)
  * ``all_finite`` is true iff every *unscaled* element is finite; a non-finite input always gives a
    non-finite output, so this is the usual "all gradients finite" test (and also catches a scale
    below 1 that overflows a gradient while unscaling).
  * The one exception to bit equality: a bfloat16 nan keeps its sign in the native op, while
    ``tf.cast``'s vectorised loop drops it; both are nans.
  * Both paths take a scalar scale only, and neither lets a gradient through the unscaling.
  * A ``tf.function`` traced outside XLA keeps the native op if later called inside a
    ``jit_compile`` function, which XLA cannot compile: trace it inside, or pass
    ``use_native=False``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_amp._flags import parse_flag
from tf_amp._upstream.tensorflow import control_flow_util, register_vectorized

_LOG = logging.getLogger("tf_amp")
_LIBRARY_BASENAME = "_tf_amp_ops.so"
_FORCE_FALLBACK_ENV = "TF_AMP_FORCE_FALLBACK_OP"
_SUPPORTED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
NATIVE_OP_NAME = "TfAmpUnscaleAndCheckFinite"

# Gradients are the end of the backward pass: nothing differentiates through their unscaling,
# and saying so lets tapes and tf.gradients stop here instead of failing on a missing gradient.
tf.no_gradient(NATIVE_OP_NAME)


@functools.lru_cache(maxsize=1)
def _load_native_module() -> tuple[Any | None, str]:
    """Loads the op library once; returns (module or None, reason it is unavailable)."""
    if parse_flag(os.environ, _FORCE_FALLBACK_ENV):  # a bad value: ValueError naming it
        return None, f"{_FORCE_FALLBACK_ENV} is set"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIBRARY_BASENAME)
    if not os.path.exists(path):
        return None, (
            f"{path} was not built; reinstall tf_amp with a C++ compiler present "
            "(pip install --no-build-isolation -e .)"
        )
    try:
        return tf.load_op_library(path), ""
    except (tf.errors.NotFoundError, OSError) as error:
        return None, f"{path} failed to load ({error}); rebuild it against this TensorFlow"


def register_native_op() -> bool:
    """Loads the op library, so that TensorFlow knows ``TfAmpUnscaleAndCheckFinite``: a
    SavedModel or meta graph written by a loss-scaled run can be loaded, and the rewrite and
    the probe take the op for a known one. Runs when this module is imported (3 ms); says
    nothing when the library is unavailable (the first use warns, saying why)."""
    try:
        return native_op_available()
    except ValueError:  # a bad TF_AMP_FORCE_FALLBACK_OP: the first use raises, naming it
        return False


@functools.lru_cache(maxsize=1)
def _warn_fallback_once(reason: str) -> None:
    _LOG.warning(
        "native UnscaleAndCheckFinite op unavailable (%s); using TensorFlow ops instead, "
        "which is slower but computes the same result.",
        reason,
    )


def native_op_available() -> bool:
    """True when the fused native op library is built and loaded."""
    return _load_native_module()[0] is not None


def in_xla_context() -> bool:
    """True while tracing code that XLA will compile (``jit_compile=True``, TPU).

    The native op has no XLA kernel; XLA fuses the TF-ops version into the surrounding step
    anyway, so that is the right path there, not a degraded one.
    """
    if tf.executing_eagerly():
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _dense_values(grad: Any) -> tf.Tensor:
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _rebuild(grad: Any, unscaled: tf.Tensor) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(unscaled, grad.indices, grad.dense_shape)
    return unscaled


def _fallback_unscale_one(value: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    if value.dtype == tf.float64:
        return value * (1.0 / tf.cast(scale, tf.float64))
    inverse = 1.0 / scale
    if value.dtype == tf.float32:
        return value * inverse
    return tf.cast(tf.cast(value, tf.float32) * inverse, value.dtype)


def _fallback(values: list[tf.Tensor], scale: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor]:
    # As the native op: a scalar scale only, and no gradient through the unscaling.
    scale = tf.stop_gradient(tf.ensure_shape(scale, []))
    values = [tf.stop_gradient(v) for v in values]
    unscaled = [_fallback_unscale_one(v, scale) for v in values]
    if not unscaled:
        return [], tf.constant(True)
    finite_flags = [tf.reduce_all(tf.math.is_finite(u)) for u in unscaled]
    return unscaled, tf.reduce_all(tf.stack(finite_flags))


def unscale_and_check_finite(
    grads: Sequence[Any], scale: Any, *, use_native: bool | None = None
) -> tuple[list[Any], tf.Tensor]:
    """Unscales gradients by ``1/scale`` and tells whether all of them are finite.

    Typical use, inside a train step::

        grads = tape.gradient(loss * scale, variables)
        grads, all_finite = tf_amp.unscale_and_check_finite(grads, scale)

    Args:
      grads: gradients as returned by ``tape.gradient``: dense tensors, ``tf.IndexedSlices``
        (only their values are unscaled and checked) or ``None`` (passed through).
      scale: the loss scale, a Python number or float32 scalar tensor.
      use_native: ``None`` uses the native op when it is available, except while tracing for
        XLA (``jit_compile=True``), where the TF ops compile and fuse; ``False`` forces the
        TF-ops path (tests, debugging); ``True`` raises if the native op is unavailable.

    Returns:
      ``(unscaled_grads, all_finite)``: a list in the order of ``grads`` with ``None`` kept in
      place, and a scalar ``tf.bool`` tensor.
    """
    if isinstance(grads, (tf.Tensor, tf.IndexedSlices, tf.Variable, np.ndarray)):
        raise TypeError(
            "unscale_and_check_finite: grads must be a list of gradients, got a single "
            f"{type(grads).__name__}; pass [grad] for one"
        )
    grads = list(grads)
    for index, grad in enumerate(grads):
        if grad is None:
            continue
        if not isinstance(grad, tf.IndexedSlices):
            try:
                grads[index] = grad = tf.convert_to_tensor(grad)
            except (TypeError, ValueError) as error:
                raise TypeError(
                    f"unscale_and_check_finite: gradient {index} is not a tensor "
                    f"({type(grad).__name__}): {error}"
                ) from None
        dtype = _dense_values(grad).dtype
        if dtype not in _SUPPORTED_DTYPES:
            raise TypeError(
                f"unscale_and_check_finite: gradient {index} has dtype {dtype.name}; "
                "supported are float16, bfloat16, float32 and float64"
            )
    present = [i for i, g in enumerate(grads) if g is not None]
    values = [_dense_values(grads[i]) for i in present]  # tensors: converted above
    scale = tf.convert_to_tensor(scale)
    if not (scale.dtype.is_floating or scale.dtype.is_integer):
        raise TypeError(
            f"unscale_and_check_finite: the scale must be a real number, got {scale.dtype.name}"
        )
    scale = tf.cast(scale, tf.float32)

    module, reason = _load_native_module()
    if use_native and module is None:
        raise RuntimeError(f"tf_amp native op requested but unavailable: {reason}")
    if use_native is None and in_xla_context():
        use_native = False
    if module is not None and use_native is not False:
        unscaled, all_finite = module.tf_amp_unscale_and_check_finite(values, scale)
    else:
        if use_native is None:
            _warn_fallback_once(reason)
        unscaled, all_finite = _fallback(values, scale)

    result: list[Any] = list(grads)
    for i, value in zip(present, unscaled, strict=True):
        result[i] = _rebuild(grads[i], value)
    return result, all_finite


def _vectorized(
    inputs: list[tuple[tf.Tensor, bool]], loop_length: tf.Tensor
) -> list[tuple[tf.Tensor, bool]]:
    """The op over the iterations of a ``tf.vectorized_map`` at once (pfor's conversion):
    each gradient unscaled as it comes, stacked or not, and one finite flag per iteration.
    A scale that differs per iteration is left to pfor's ``while_loop``."""
    *grads, (scale, scale_stacked) = inputs
    if scale_stacked:
        raise NotImplementedError(f"{NATIVE_OP_NAME}: a scale that differs per iteration")
    # The op itself, on the stacked tensors: unscaling is elementwise. Its one flag covers
    # every iteration; each iteration's own is taken below.
    unscaled, _ = unscale_and_check_finite([tensor for tensor, _ in grads], scale)
    flags = [tf.fill([loop_length], True)]
    for value, (_, stacked) in zip(unscaled, grads, strict=True):
        finite = tf.math.is_finite(value)
        if stacked:
            flags.append(tf.reduce_all(tf.reshape(finite, [loop_length, -1]), axis=1))
        else:
            flags.append(tf.fill([loop_length], tf.reduce_all(finite)))
    per_iteration = tf.reduce_all(tf.stack(flags), axis=0)
    return [(value, stacked) for value, (_, stacked) in zip(unscaled, grads, strict=True)] + [
        (per_iteration, True)
    ]


# TensorFlow must know the op before it imports a graph that uses it (see register_native_op).
register_native_op()
register_vectorized(NATIVE_OP_NAME, _vectorized)
