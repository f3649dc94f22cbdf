"""The update guard: the arithmetic that only updates variables stays float32.

An optimizer step is elementwise arithmetic between a gradient and float32 state: Adam's
``m += (g - m) * (1 - beta1)``, ``v += (g * g - v) * (1 - beta2)``, ``w -= lr * m / (sqrt(v) +
eps)``; a batch normalization's moving statistics; gradient clipping. TensorFlow's pass paints
the start of it half whenever the gradient comes out of a half MatMul (its pass 4: an infer
op fed by a half op): ``g - m`` then reads the float32 moment through a Cast to half, rounds
it, and casts back to float32 before the assignment. That is what float32 master weights exist
to avoid (the update and the optimizer's state keep float32's precision; NVIDIA's guide, and
Keras's policies, which cast each weight gradient to float32 as it leaves the layer), and on a
CPU it is also slower: bfloat16 elementwise kernels there run 2x to 9x slower than float32's,
and every painted update op costs a Cast of a float32 state read.

Which nodes: those whose every data consumer is a variable update (``Assign*``,
``ResourceApply*``, scatter updates) or such a node, found backwards from the updates. The walk
stops at allow-list ops (a weight-gradient MatMul keeps its half speed; its output is cast to
float32 once) and at reductions (``BiasAddGrad``, ``Sum``...: casting their small result is
cheaper than casting their big input), and never enters a loop (a node on a cycle never has all
its consumers decided).
"""

from __future__ import annotations

from collections.abc import Collection

from tf_amp.type_attrs import BodyView

# Ops that write a variable from their (non-resource) data inputs.
_UPDATE_OPS: frozenset[str] = frozenset(
    {
        "Assign",
        "AssignAdd",
        "AssignSub",
        "AssignVariableOp",
        "AssignAddVariableOp",
        "AssignSubVariableOp",
        "ScatterAdd",
        "ScatterSub",
        "ScatterUpdate",
    }
)
_UPDATE_PREFIXES: tuple[str, ...] = (
    "ResourceApply",
    "ResourceSparseApply",
    "ResourceScatter",
    "Apply",
    "SparseApply",
)
# Reductions: their output is smaller than their input, so the cast belongs after them.
# (Segment sums are not among them: densifying an embedding's gradient, their output is the
# whole table, bigger than the gathered rows that come in.)
_REDUCTIONS: frozenset[str] = frozenset(
    {"BiasAddGrad", "Sum", "Mean", "Prod", "Max", "Min", "EuclideanNorm", "L2Loss"}
)


def is_variable_update(op: str) -> bool:
    """Whether ``op`` writes a variable from its data inputs."""
    return op in _UPDATE_OPS or op.startswith(_UPDATE_PREFIXES)


def update_only_nodes(view: BodyView, allow_ops: Collection[str]) -> frozenset[int]:
    """Indices of the real nodes of ``view`` whose results serve only variable updates.

    ``allow_ops``: the allow-list op names (never guarded). A node qualifies when it has at
    least one data consumer and each of them is a variable update or a qualifying node; it is
    not an allow-list op, a reduction, or itself an update. One pass over the edges, then a
    walk over the qualifying nodes only (decisions cached per op type).
    """
    num_real = view.num_real
    ops = view.ops
    ready = [n for n in range(num_real) if is_variable_update(ops[n])]
    if not ready:
        return frozenset()
    undecided = [0] * len(view.names)  # data consumers not yet known to be update-only
    producers: dict[int, list[int]] = {}
    for src, dst in zip(view.e_src, view.e_dst, strict=True):
        undecided[src] += 1
        producers.setdefault(dst, []).append(src)
    walkable: dict[str, bool] = {}  # per op type: may a node of it be guarded
    guarded: set[int] = set()
    while ready:
        for src in producers.get(ready.pop(), ()):
            undecided[src] -= 1
            if undecided[src] or src >= num_real:
                continue
            op = ops[src]
            may = walkable.get(op)
            if may is None:
                may = op not in _REDUCTIONS and op not in allow_ops and not is_variable_update(op)
                walkable[op] = may
            if may:
                guarded.add(src)
                ready.append(src)
    return frozenset(guarded)
