"""Which float32 constants a half type cannot hold: the values a runtime Cast would make
infinite. Read by the range guard (the painter) and by constant folding (the cast planner)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from tf_amp.type_attrs import DT_FLOAT, DT_HALF


def float32_values(tensor: Any) -> np.ndarray:
    """A float32 TensorProto's values, from either encoding TensorFlow writes
    (``tensor_content`` bytes, or ``float_val`` for scalars and splats)."""
    if tensor.tensor_content:
        return np.frombuffer(tensor.tensor_content, dtype="<f4")
    return np.asarray(tensor.float_val, dtype=np.float32)


def rounded(values: np.ndarray, half: Any) -> np.ndarray:
    """``values`` cast to ``half`` (round to nearest even, as TensorFlow's Cast), infinities
    and NaNs of ``values`` set to 0 so that only overflows are infinite."""
    with np.errstate(over="ignore"):
        return np.where(np.isfinite(values), values, 0).astype(half)


def beyond_range(values: np.ndarray, half: Any) -> bool:
    """Whether a finite value of ``values`` rounds to an infinity in ``half``: beyond the
    midpoint past its largest finite number, not the number itself (65510 rounds to float16's
    65504, as a runtime Cast does; it was taken for a sentinel and became 32752)."""
    return bool(np.isinf(rounded(values, half)).any())


def half_numpy_dtype(target: int) -> Any:
    """The numpy type of a half ``DataType`` enum (float16, or ml_dtypes' bfloat16)."""
    if target == DT_HALF:
        return np.float16
    from tf_amp._upstream.tensorflow import dtypes

    return dtypes.bfloat16.as_numpy_dtype


# Ops that read a "very large" constant as a sentinel (an attention mask added or selected, a
# bound): constant folding clips it to the half type's range for them, which keeps its
# meaning. Any other op scales by it, and clipped its result is silently wrong.
SENTINEL_READERS: frozenset[str] = frozenset({
    "Add", "AddV2", "Sub", "BiasAdd", "AddN", "Select", "SelectV2", "Minimum", "Maximum",
    "ClipByValue", "Less", "LessEqual", "Greater", "GreaterEqual", "Equal", "NotEqual",
})
CONST_OPS: frozenset[str] = frozenset({"Const", "HostConst"})
_DIVISIONS = frozenset({"RealDiv", "Div", "DivNoNan"})
# Ops that only pass a value on (spread, reshaped): their readers decide.
_PASSING_ON = frozenset({
    "Identity", "Fill", "BroadcastTo", "Tile", "Reshape", "ExpandDims", "Squeeze", "Pack",
    "ConcatV2", "Transpose",
})


def readers_of_constants_beyond_range(view: Any, target: int) -> set[int]:
    """The nodes of ``view`` other than sentinel readers that read, as data, a float32 Const
    holding a finite value the half ``target`` cannot hold.

    Kept float32 (``Block.CONSTANT_BEYOND_RANGE``): ``h * 1e5`` in float16 read the constant
    clipped to 65504 and came out 1.53x too small, with no inf to tell; TensorFlow's pass and
    Keras's mixed policy give inf there. In float32 it is right. So is a division by a
    constant whose reciprocal is beyond range (``h / 1e-5``): Grappler turns it into a
    product by the reciprocal, infinite in float16.

    A constant spread by an op that only passes it on (``tf.fill(shape, -1e9)``,
    ``broadcast_to``) is judged by the readers behind that op: kept float32 for a select, the
    fill became a runtime Cast to -inf and a fully masked softmax row NaN."""
    half = half_numpy_dtype(target)
    constants = _extreme_constants(view, half)
    if not constants:  # the common case: no edge map to build
        return set()
    readers: dict[int, list[tuple[int, int]]] = {}
    for k in range(len(view.e_src)):
        if view.e_dst[k] < view.num_real:
            readers.setdefault(view.e_src[k], []).append((view.e_dst[k], view.e_dport[k]))
    found: set[int] = set()
    for s, values in constants.items():
        passing, scaling = _readers_through_passes(view, readers, s)
        scaling = {d for d, port in scaling if _scales_beyond(values, view.ops[d], port, half)}
        if scaling:
            found |= scaling | passing  # the passed-on value stays float32 up to them
    return found


def _extreme_constants(view: Any, half: Any) -> dict[int, np.ndarray]:
    """The float32 Consts of ``view`` (node -> values) with a value beyond ``half``'s largest
    finite number, or, where the body divides, a nonzero one below its reciprocal (a
    divisor's reciprocal may be beyond): a pass over each Const's values, to spare the rest
    of the walk. (A body without a division asks only for large values: the small ones, an
    epsilon in every normalization, would otherwise send most Keras graphs down the walk.)"""
    largest = float(ml_dtypes.finfo(half).max)
    smallest = 1 / largest if any(op in _DIVISIONS for op in view.ops) else 0.0
    found = {}
    for n in range(view.num_real):
        if view.ops[n] not in CONST_OPS:
            continue
        tensor = view.protos[n].attr["value"].tensor
        if tensor.dtype != DT_FLOAT:
            continue
        values = float32_values(tensor)
        magnitudes = np.abs(values[np.isfinite(values)])  # infinities and NaNs stay as they are
        nonzero = magnitudes[magnitudes > 0]
        if nonzero.size and (nonzero.max() > largest or nonzero.min() < smallest):
            found[n] = values
    return found


def _readers_through_passes(
    view: Any, readers: dict[int, list[tuple[int, int]]], s: int
) -> tuple[set[int], set[tuple[int, int]]]:
    """(the ops that pass ``s``'s value on, the (reader, port)s behind them that are no
    sentinel readers)."""
    passing: set[int] = set()
    scaling: set[tuple[int, int]] = set()
    todo = [s]
    while todo:
        for d, port in readers.get(todo.pop(), ()):
            op = view.ops[d]
            if op in _PASSING_ON:
                if d not in passing:
                    passing.add(d)
                    todo.append(d)
            elif op not in SENTINEL_READERS:
                scaling.add((d, port))
    return passing, scaling


def _scales_beyond(values: np.ndarray, op: str, port: int, half: Any) -> bool:
    """Whether ``op`` reading ``values`` at ``port`` scales by a value ``half`` cannot hold
    (a divisor by its reciprocal, which Grappler multiplies by)."""
    if op in _DIVISIONS and port == 1:
        with np.errstate(divide="ignore", over="ignore"):
            values = np.float32(1) / values[values != 0]
    return beyond_range(values, half)


def overflows(tensor: Any, target: int) -> bool:
    """Whether a finite float32 value of ``tensor`` becomes an infinity cast to ``target``."""
    return beyond_range(float32_values(tensor), half_numpy_dtype(target))
