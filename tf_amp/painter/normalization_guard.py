"""The normalization guard: keep the sum of a batch/layer normalization out of half precision.

``tf.nn.batch_normalization`` (which Keras 3's ``BatchNormalization`` and TF1's
``tf.compat.v1.layers.batch_normalization`` call) computes

    inv = rsqrt(variance + epsilon) [* scale]
    y   = x * inv + (offset - mean * inv)        # or x * inv + (-mean) * inv

The two terms of the final sum are each about ``|mean| / std`` times larger than ``y``, and they
cancel. In half precision each carries a rounding error of ``2**-11`` (float16) or ``2**-8``
(bfloat16) of its own size, so ``y`` gets a relative error of ``|mean| / std`` times that: a
feature map whose mean is a hundred standard deviations from zero (common over small batches and
1x1 maps) comes out with a 5% error in float16. TensorFlow's own pass paints ``x * inv`` and the
sum half whenever they sit between two allow-list ops (they are infer-list ``Mul`` and
``AddV2``); Keras's ``mixed_float16`` policy computes the whole normalization in float32.

Measured (``bench/corpus.py``, MobileNetV2 alpha 0.35, 32x32, batch 8, 48 batches from the same
weights): mean |first-step loss - float32's| was 0.048 painted as TensorFlow paints, 0.032 for
Keras's ``mixed_float16``; with the guard, 0.037 (a paired gap to Keras of 0.005 remains, about
two standard errors; over 16 batches 0.036 against 0.035). Float16 elementwise arithmetic
rounds the same on a GPU as on a CPU (each op computes in float32 and rounds once), so the
measurement holds on the GPUs float16 targets.

The guard keeps the two nodes that round the cancelling terms: the ``Mul`` of ``x`` by the
rsqrt-derived scale, and the ``Add``/``AddV2`` of the shift; and, in the backward pass, the
``Mul`` of the upstream gradient by that same ``x`` (the gradient of ``inv``): ``x`` is as far
from zero as the mean, and times a loss-scaled gradient it overflowed float16 (measured: a
Conv2D with a mean of 100 before ``BatchNormalization``, 2 of 20 steps skipped and the scale
a quarter of Keras's ``mixed_float16``, which skipped none; guarded, none). Everything else
(the statistics are float32 already, being ``Mean``) is painted as TensorFlow paints it.
``RewriteConfig(guard_normalization=False)`` / ``TF_AMP_GUARD_NORMALIZATION=0`` turns it off.
"""

from __future__ import annotations

from tf_amp.type_attrs import BodyView

_SUMS = frozenset({"Add", "AddV2"})


def normalization_sum_nodes(view: BodyView) -> frozenset[int]:
    """Indices of the nodes of ``view`` that compute ``x * inv`` and ``x * inv + shift`` of a
    normalization, where ``inv`` comes from an ``Rsqrt`` (optionally times a scale) and the
    shift is ``offset - mean * inv`` or ``-mean * inv`` with the same ``inv``. Matched on the
    ops, not on names: TF1 graphs and renamed scopes have the same structure."""
    if "Rsqrt" not in view.ops:  # most bodies: skip building the producer map per edge
        return frozenset()
    producers = view.data_producers()

    def inputs(node: int) -> list[tuple[int, int]]:
        by_port = producers.get(node, {})
        return [by_port[port] for port in sorted(by_port)]

    def is_inverse_std(tensor: tuple[int, int]) -> bool:
        op = view.ops[tensor[0]]
        if op == "Rsqrt":
            return True
        return op == "Mul" and any(view.ops[s] == "Rsqrt" for s, _ in inputs(tensor[0]))

    def shift_shares(shift: int, scales: set[tuple[int, int]]) -> bool:
        """``shift`` is ``offset - mean * inv``, ``-(mean * inv)`` or ``(-mean) * inv`` (what
        ``-mean * inv`` traces to) with ``inv`` one of ``scales``."""
        operands = inputs(shift)
        op = view.ops[shift]
        if op == "Sub" and len(operands) == 2:
            mean_times = operands[1][0]
        elif op == "Neg" and len(operands) == 1:
            mean_times = operands[0][0]
        elif op == "Mul" and any(view.ops[s] == "Neg" for s, _ in operands):
            mean_times = shift
        else:
            return False
        return view.ops[mean_times] == "Mul" and bool(scales & set(inputs(mean_times)))

    guarded: set[int] = set()
    centred_inputs: set[tuple[int, int]] = set()  # the x of each guarded x * inv
    for total in range(view.num_real):
        if view.ops[total] not in _SUMS:
            continue
        operands = inputs(total)
        if len(operands) != 2:
            continue
        for (scaled, _), (shift, _) in (operands, operands[::-1]):
            if view.ops[scaled] != "Mul":
                continue
            scales = {t for t in inputs(scaled) if is_inverse_std(t)}
            if scales and shift_shares(shift, scales):
                guarded.update((scaled, total))
                centred_inputs.update(t for t in inputs(scaled) if t not in scales)
                break
    # The backward's dy * x (the gradient of inv) multiplies the loss-scaled dy by the same
    # uncentred x: a hundred times the std, it overflowed float16 where float32 and Keras's
    # policy stay finite (steps skipped, the scale halved).
    for node in range(view.num_real) if centred_inputs else ():
        if view.ops[node] == "Mul" and node not in guarded:
            operands = inputs(node)
            if centred_inputs.intersection(operands) and not any(map(is_inverse_std, operands)):
                guarded.add(node)
    return frozenset(guarded)
