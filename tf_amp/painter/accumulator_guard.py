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
promotes to float32). The guard keeps the update float32. In a ``While`` body function it
costs no Cast: the loop variable is float32 either way (a body's signature does not change),
so a half sum needed the running value cast to half and the result back to float32 every
iteration; guarded, only the addend is cast up. A TF1 loop (and a functional one lowered by
inlining) has no such boundary: its loop variable (``Merge``, ``Switch``, ``NextIteration``)
would take the colour of its neighbours and round the float32 sum back to half every
iteration, so the guard keeps that chain float32 too.

Which nodes: those on a path from loop variable ``k``'s next value back to its value in the
body (in a ``While`` body function, return ``k`` and argument ``k``; in a TF1 loop, the
``NextIteration`` feeding a ``Merge`` and that ``Merge``), through sums (``Add``, ``AddV2``,
``AddN``, and ``Sub`` by its first input: ``acc + x + y``, two ``+=``, ``acc - x``), ops that
pass a value on (``Identity``, ``IdentityN``, ``Switch``, ``Reshape``, ``EnsureShape``, a
``Select``'s branches: a masked RNN state) and products by a constant (a decay:
``0.999 * acc + x``), when at least one sum is among them. ``x - acc`` alternates rather than
accumulates and is left alone. ``RewriteConfig(guard_accumulators=False)`` /
``TF_AMP_GUARD_ACCUMULATORS=0`` turns it off.
"""

from __future__ import annotations

from tf_amp.type_attrs import BodyView
from tf_amp.type_attrs.body_view import ARG_OP, RETVAL_OP

_SUMS = frozenset({"Add", "AddV2", "Sub", "AddN"})
# Ops that pass a value on, and which of their inputs carry it (None: output k <- input k).
_CARRIERS: dict[str, tuple[int, ...] | None] = {
    "Identity": (0,),
    "Switch": (0,),
    "Reshape": (0,),
    "EnsureShape": (0,),
    "Select": (1, 2),
    "SelectV2": (1, 2),
    "IdentityN": None,
}
_SCALINGS = frozenset({"Mul"})  # a product by a constant (a decay)


def accumulator_nodes(view: BodyView) -> frozenset[int]:
    """Indices of the nodes in ``view`` that update a loop variable from itself (see the
    module docstring): in a ``While`` body function (``view.is_loop_body``) and in TF1 loops
    of any body, found by their ``NextIteration`` nodes."""
    has_v1_loop = "NextIteration" in view.ops
    if not (view.is_loop_body or has_v1_loop) or not _SUMS.intersection(view.ops):
        return frozenset()
    producers = view.data_producers()

    found: set[int] = set()
    if view.is_loop_body:
        args = [n for n in range(view.num_real, len(view.names)) if view.ops[n] == ARG_OP]
        rets = [n for n in range(view.num_real, len(view.names)) if view.ops[n] == RETVAL_OP]
        for ret, key in zip(rets, view.ret_keys, strict=True):
            k = view.ret_positions.get(key, len(args))
            fed = producers.get(ret, {}).get(0)
            if k < len(args) and fed is not None:
                found |= _update_path(view, producers, fed, args[k])
    if has_v1_loop:
        merges_fed: dict[int, list[int]] = {}  # NextIteration -> the Merge nodes it feeds
        for src, dst in zip(view.e_src, view.e_dst, strict=True):
            if view.ops[src] == "NextIteration" and view.ops[dst] == "Merge":
                merges_fed.setdefault(src, []).append(dst)
        for node, merges in merges_fed.items():
            fed = producers.get(node, {}).get(0)
            for merge in merges:
                path = _update_path(view, producers, fed, merge) if fed is not None else set()
                if path:  # the loop variable itself stays float32 with its sum
                    found |= path | {node, merge}
    return frozenset(n for n in found if n < view.num_real)


def _update_path(
    view: BodyView,
    producers: dict[int, dict[int, tuple[int, int]]],
    next_value: tuple[int, int],
    variable: int,
) -> set[int]:
    """The nodes on paths from ``next_value`` back to ``variable`` through sums, carriers and
    products by a constant; empty unless such a path exists with a sum on it."""
    on_path: dict[tuple[int, int], bool] = {}
    visiting: set[tuple[int, int]] = set()
    nodes: set[int] = set()

    def inputs_followed(node: int, port: int) -> list[tuple[int, int]]:
        op = view.ops[node]
        fed = producers.get(node, {})
        if op == "Sub":  # acc - x accumulates; x - acc does not (it alternates)
            return [fed[0]] if 0 in fed else []
        if op in _SUMS:
            return list(fed.values())
        if op in _CARRIERS:
            ports = _CARRIERS[op]
            wanted = (port,) if ports is None else ports
            return [fed[p] for p in wanted if p in fed]
        if op in _SCALINGS:
            values = list(fed.values())
            if any(view.ops[src] == "Const" for src, _ in values):
                return [v for v in values if view.ops[v[0]] != "Const"]
        return []

    def reaches(tensor: tuple[int, int]) -> bool:
        node = tensor[0]
        if node == variable:
            return True
        if tensor in on_path:
            return on_path[tensor]
        if tensor in visiting or node >= view.num_real:
            return False
        visiting.add(tensor)
        hit = False
        for source in inputs_followed(*tensor):
            hit |= reaches(source)  # every input: each path's nodes are collected
        visiting.discard(tensor)
        on_path[tensor] = hit
        if hit:
            nodes.add(node)
        return hit

    if not reaches(next_value):
        return set()
    return nodes if any(view.ops[n] in _SUMS for n in nodes) else set()
