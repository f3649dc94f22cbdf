"""Folding a Cast into the constant it reads: a float32 Const read only by half ops becomes a
half Const in place (``RewriteConfig.fold_constant_casts``).

Saves the Cast op and half the constant's bytes in the GraphDef. Only Consts that nothing
float32 reads (and that are not preserved) qualify, so no reader sees a changed dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from tf_amp.painter import ALLOW_C, Painting
from tf_amp.painter.half_range import (
    CONST_OPS,
    beyond_range,
    float32_values,
    half_numpy_dtype,
    overflows,
    rounded,
)
from tf_amp.painter.reasons import Block
from tf_amp.type_attrs import DT_FLOAT, BodyView

# Ops that add a constant to a value: a sentinel beyond range must leave room there. (The
# painter keeps float32 every reader of such a constant but the sentinel readers:
# ``tf_amp.painter.half_range.SENTINEL_READERS``.)
SUM_OPS: frozenset[str] = frozenset({"Add", "AddV2", "Sub", "BiasAdd", "AddN"})


def fold_consts_in_place(view: BodyView, painting: Painting, target: int) -> set[int]:
    """Float32 Consts whose every data consumer is half: rewrite their value to half.

    Saves the Cast op and half the constant's bytes in the GraphDef. Only Consts that nothing
    float32 reads (and that are not preserved) qualify, so no reader sees a changed dtype.
    """
    colour = painting.colour
    candidates: dict[int, bool] = {}
    added: set[int] = set()  # Consts a sum reads (see _saturating_cast)
    for k in range(len(view.e_src)):
        s = view.e_src[k]
        if view.ops[s] not in CONST_OPS or candidates.get(s) is False:
            continue
        dst = view.e_dst[k]
        dvs = view.in_v[dst]
        q = view.e_dport[k]
        dv = dvs[q] if q < len(dvs) else -1
        candidates[s] = candidates.get(s, True) and dv >= 0 and colour[dv] == ALLOW_C
        if view.ops[dst] in SUM_OPS:
            added.add(s)
    folded: set[int] = set()
    for s, all_half in candidates.items():
        proto = view.protos[s]
        if not all_half or painting.node_block[s] == Block.PRESERVED:
            continue
        if proto.attr["dtype"].type != DT_FLOAT:
            continue
        if not _tensor_to_half(proto.attr["value"].tensor, target, s in added):
            continue
        proto.attr["dtype"].type = target
        folded.add(s)
    return folded


def saturated_half_copy(proto: Any, target: int, added: Callable[[], bool]) -> Any | None:
    """A half copy of float32 Const ``proto`` when a runtime Cast would turn one of its finite
    values into an infinity; else None (a Cast computes the same thing).

    For a Const that float32 ops read too, so it cannot change in place: its half readers get
    the copy, clipped as ``_saturating_cast`` says, instead of a Cast to -inf. The copy keeps
    the Const's control inputs (its frame in a v1 while loop) and device. ``added()``: whether
    a sum reads the Const (asked only for one beyond range).
    """
    if proto.op not in CONST_OPS or proto.attr["dtype"].type != DT_FLOAT:
        return None
    tensor = proto.attr["value"].tensor
    if tensor.dtype != DT_FLOAT or not overflows(tensor, target):
        return None
    copy = type(proto)()
    copy.CopyFrom(proto)
    if not _tensor_to_half(copy.attr["value"].tensor, target, added()):
        return None
    copy.attr["dtype"].type = target
    return copy


def _tensor_to_half(tensor: Any, target: int, added: bool = False) -> bool:
    """Re-encode a float32 TensorProto as ``target`` in place; False if not possible.

    Works on the two encodings TensorFlow writes (``tensor_content`` bytes, or ``float_val``
    for scalars and splats) with numpy directly: ``make_tensor_proto`` costs ~70 us a call,
    too slow for graphs with tens of thousands of Consts.
    """
    if tensor.dtype != DT_FLOAT:
        return False
    half = half_numpy_dtype(target)
    values = _saturating_cast(float32_values(tensor), half, added)
    if tensor.tensor_content:
        tensor.tensor_content = values.view("<u2").tobytes()
    else:  # float_val (empty for a zero-filled Const: nothing to convert)
        bits = values.view(np.uint16)
        del tensor.float_val[:]
        tensor.half_val.extend(int(b) for b in bits)
    tensor.dtype = target
    return True


def _saturating_cast(values: np.ndarray, half: Any, added: bool = False) -> np.ndarray:
    """``values`` in ``half``, finite values beyond its range clipped instead of rounded to
    infinity: to its largest finite number, or to half of it (float16: ±32752) for a Const
    that a sum reads.

    Why: such constants are "very large" sentinels, above all an attention mask, which adds
    or selects -1e9 (a float32 graph's value: Keras picks -3e4 only when it builds the layer
    in float16). As float16 -inf, a fully masked row's softmax is exp(-inf - -inf): NaN, and
    every step is skipped. Clipped, the mask keeps its meaning and the row comes out uniform,
    as in float32 and under Keras's mixed policy. Added to the logits, -65504 still summed to
    -inf for any logit below -16, so an added sentinel leaves room; one used as a bound
    (``minimum(x, 1e5)``, a ``where`` operand) keeps the whole range, or it would cut values
    between the two. Infinities and NaNs stay what they are; values within range are not
    touched.
    """
    if not beyond_range(values, half):
        return values.astype(half)
    largest = float(ml_dtypes.finfo(half).max)
    sentinel = largest / 2 if added else largest
    beyond = np.isinf(rounded(values, half))
    clipped = np.where(beyond, np.copysign(sentinel, values), values)
    return clipped.astype(half)
