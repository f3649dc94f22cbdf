"""The accumulator guard: a loop's running sum stays float32.

A loop variable updated by addition (``acc = acc + x`` in a ``tf.while_loop`` body) adds one
rounding error per iteration, each of the size of ``acc``, not of ``x``. In half precision,
once ``acc`` is large the addend falls below half a unit in its last place and is lost.
Measured (``tests/test_accumulator_guard.py``): a loop adding a small MatMul's result 5,000
times stopped growing at 128 in float16 where float32 reached 229.6 (guarded: 229.6); a tanh
RNN whose loss sums every step's outputs over 300 steps ended 11% low in bfloat16 (guarded:
2.4%, the rest is the bfloat16 RNN itself). The backward pass has the same shape: ``while_v2``
sums the gradient of each loop-invariant tensor (an RNN's weights) over the iterations in the
gradient loop's body, so that RNN's weight gradient was 2.6e-3 from float32's in float16 and
1.8e-2 in bfloat16 (guarded: 4.5e-4 and 3.4e-3, relative norms), and with the loss scale a
half sum can leave float16's range where float32's does not.

TensorFlow's pass paints such an ``AddV2`` half when the addend comes out of a half op (its
pass 4: an infer op fed by a half op); ``torch.autocast`` would not (float32 + float16
promotes to float32). The guard keeps the sum float32. It costs no Cast: the loop variable is
float32 either way (a body's signature does not change), so a half sum needed the running
value cast to half and the result back to float32 every iteration; guarded, only the addend
is cast up.

Which nodes: an ``Add`` / ``AddV2`` / ``Sub`` / ``AddN`` whose result becomes loop variable
``k``'s next value and one of whose inputs is loop variable ``k`` (through ``Identity``
nodes): in a ``While`` body function, return ``k`` and argument ``k``; in a TF1 loop (and a
functional loop lowered by inlining), the ``NextIteration`` feeding a ``Merge`` and that
``Merge``'s value in the body (through its ``Switch``). ``RewriteConfig(guard_accumulators=
False)`` / ``TF_AMP_GUARD_ACCUMULATORS=0`` turns it off.
"""

from __future__ import annotations

from tf_amp.type_attrs import BodyView
from tf_amp.type_attrs.body_view import ARG_OP, RETVAL_OP

_SUMS = frozenset({"Add", "AddV2", "Sub", "AddN"})
# Ops a loop variable passes through unchanged on its way into or out of the sum: their
# output comes from their first data input (Identity; Switch, either output), or IdentityN's
# output k from its input k.
_PASS_THROUGH = frozenset({"Identity", "Switch"})


def accumulator_nodes(view: BodyView) -> frozenset[int]:
    """Indices of the sums in ``view`` that update a loop variable from itself: in a ``While``
    body function (``view.is_loop_body``: its argument ``k`` and return ``k`` are one loop
    variable), and in TF1 loops of any body, found by their ``NextIteration`` nodes."""
    has_v1_loop = "NextIteration" in view.ops
    if not (view.is_loop_body or has_v1_loop) or not _SUMS.intersection(view.ops):
        return frozenset()
    # consumer -> input port -> (producer node, its output port)
    producers: dict[int, dict[int, tuple[int, int]]] = {}
    consumers: dict[int, list[int]] = {}
    for src, sport, dst, dport in zip(
        view.e_src, view.e_sport, view.e_dst, view.e_dport, strict=True
    ):
        producers.setdefault(dst, {})[dport] = (src, sport)
        consumers.setdefault(src, []).append(dst)

    def source(tensor: tuple[int, int]) -> int:
        """The node whose output ``tensor`` is, through the ops that pass it on unchanged."""
        seen = set()
        while tensor not in seen:
            seen.add(tensor)
            node, port = tensor
            op = view.ops[node]
            if op in _PASS_THROUGH:
                port = 0
            elif op != "IdentityN":
                break
            fed = producers.get(node, {}).get(port)
            if fed is None:
                break
            tensor = fed
        return tensor[0]

    def sum_updating(result: tuple[int, int], variable: int) -> int | None:
        """The sum that ``result`` passes on, when one of its inputs is ``variable``."""
        node = source(result)
        if node >= view.num_real or view.ops[node] not in _SUMS:
            return None
        inputs = producers.get(node, {}).values()
        return node if any(source(i) == variable for i in inputs) else None

    # Pairs (where the next value is read, the loop variable it must come from).
    updates: list[tuple[tuple[int, int] | None, int]] = []
    if view.is_loop_body:
        args = [n for n in range(view.num_real, len(view.names)) if view.ops[n] == ARG_OP]
        rets = [n for n in range(view.num_real, len(view.names)) if view.ops[n] == RETVAL_OP]
        for ret, key in zip(rets, view.ret_keys, strict=True):
            k = view.ret_positions.get(key, len(args))
            if k < len(args):
                updates.append((producers.get(ret, {}).get(0), args[k]))
    if has_v1_loop:
        for node in range(view.num_real):
            if view.ops[node] == "NextIteration":
                fed = producers.get(node, {}).get(0)
                merges = [m for m in consumers.get(node, ()) if view.ops[m] == "Merge"]
                updates.extend((fed, merge) for merge in merges)
    found = (sum_updating(fed, variable) for fed, variable in updates if fed is not None)
    return frozenset(node for node in found if node is not None)
