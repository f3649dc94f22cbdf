"""The node attr that keeps a node float32 whatever the lists say, and how to read it.

Set by users (``tf_amp.keep_float32``, exclude scopes in a traced function) and by the cast
planner (on the float32 view a name-preserving rewrite leaves under an op's old name). Read
while the vertex view is built, so the painter needs no second sweep over the attr maps.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

from tf_amp.type_attrs.op_info import function_attr_names

EXCLUDE_ATTR = "_tf_amp_exclude"  # node attr: never convert this node
_FORWARD_FUNCTION = "forward_function_name"  # a tape's backward function's attr
# The attr's two values: ``b=True`` is the user's (``tf_amp.keep_float32``, exclude scopes in a
# traced function), and its gradient ops are kept float32 too; ``s=FLOAT32_VIEW`` marks the
# float32 view the rewriter leaves under an op's old name in name-preserving mode, which no
# later rewrite may paint but which excludes nothing else. One attr, so telling them apart
# costs no second lookup per node.
FLOAT32_VIEW = b"float32-view"
# The ops that call a library function named in their ``f`` attr.
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
# A gradient op's name: a tape's "gradient_tape/<forward op>/..." or tf.gradients'
# "gradients[_N]/<forward op>_grad/..."
_GRADIENT_PREFIX = re.compile(r"(?:gradient_tape|gradients(?:_\d+)?)/")
# while_v2 / cond_v2 name the gradient of a body or branch function "<forward>_grad_<uid>"
_GRADIENT_FUNCTION = re.compile(r"^(.+)_grad_\d+$")
# ``BodyView.exclude_attr`` values
EXCLUDE_NOT_READ, EXCLUDE_NONE, EXCLUDE_USER, EXCLUDE_VIEW = 0, 1, 2, 3


def exclude_mark(attrs: Any) -> int:
    """EXCLUDE_NONE / EXCLUDE_USER / EXCLUDE_VIEW for a NodeDef's attr map."""
    value = attrs.get(EXCLUDE_ATTR)
    if value is None:
        return EXCLUDE_NONE
    if value.b:
        return EXCLUDE_USER
    return EXCLUDE_VIEW if value.s == FLOAT32_VIEW else EXCLUDE_NONE


def mark_callees_of_excluded_calls(graph_def: Any, scopes: Collection[str] = ()) -> int:
    """Marks excluded (``b=True``) every node of each library function that a marked node (or
    a node of the main graph under one of the excluded name ``scopes``) calls, transitively;
    returns how many nodes it marked. Changes ``graph_def`` in place.

    Why: ``tf_amp.keep_float32`` marks the ops built in its own graph, so a nested
    ``tf.function`` called in the block is one marked call node, and the callee's nodes carry
    nothing. Inlining (``runtime._graphdef.inline_library``) then replaces the call by the
    callee's unmarked nodes, which were painted half where the user kept float32. Run before
    inlining; a function also called from outside the block is kept float32 there too.
    """
    functions = {f.signature.name: f for f in graph_def.library.function}
    if not functions:
        return 0
    in_scope = scope_test(scopes)
    pending = [
        callee
        for nodes in (graph_def.node, *(f.node_def for f in functions.values()))
        for node in nodes
        if exclude_mark(node.attr) == EXCLUDE_USER
        for callee in called_functions(node, functions)
    ]
    pending += [
        callee
        for node in graph_def.node
        if in_scope is not None and in_scope(node.name)
        for callee in called_functions(node, functions)
    ]
    # A tape's gradient of a call is a call of its own (plain "PartitionedCall", named after
    # nothing excluded) of a backward function that names its forward one: it is kept
    # float32 with it, as the gradient ops of an excluded region are.
    backward_of = {
        f.attr[_FORWARD_FUNCTION].s.decode(): name
        for name, f in functions.items()
        if _FORWARD_FUNCTION in f.attr
    }
    gradients = gradient_functions(functions)
    done: set[str] = set()
    backward_calls: set[str] = set()
    marked = 0
    while pending:
        name = pending.pop()
        if name in done:
            continue
        done.add(name)
        if name in backward_of:
            pending.append(backward_of[name])
            backward_calls.add(backward_of[name])
        pending.extend(gradients.get(name, ()))
        for node in functions[name].node_def:
            if exclude_mark(node.attr) != EXCLUDE_USER:
                node.attr[EXCLUDE_ATTR].b = True
                marked += 1
            pending.extend(called_functions(node, functions))
    for nodes in (graph_def.node, *(f.node_def for f in functions.values())):
        for node in nodes if backward_calls else ():
            if (exclude_mark(node.attr) != EXCLUDE_USER
                    and backward_calls.intersection(called_functions(node, functions))):
                node.attr[EXCLUDE_ATTR].b = True
                marked += 1
    return marked


def is_gradient_of(name: str, excluded: Collection[str]) -> bool:
    """True for a gradient op named after a forward op at or under a name in ``excluded``:
    gradient ops carry neither the forward op's scope nor its attr, only its name."""
    match = _GRADIENT_PREFIX.match(name)
    if match is None or not excluded:
        return False
    parts = [p[:-5] if p.endswith("_grad") else p for p in name[match.end():].split("/")]
    return any("/".join(parts[:depth]) in excluded for depth in range(1, len(parts) + 1))


def scope_test(scopes: Collection[str]) -> Callable[[str], bool] | None:
    """Whether a node name is an excluded scope or under one (None: no scope given).

    A scope is the node name's whole leading part: ``dense`` covers ``dense/MatMul``, not
    ``dense_1/MatMul``; a trailing ``/`` is optional."""
    names = frozenset(s.rstrip("/") for s in scopes if s.strip("/"))
    if not names:
        return None
    prefixes = tuple(name + "/" for name in names)
    return lambda name: name in names or name.startswith(prefixes)


def excluded_node_names(graph_def: Any, scopes: Collection[str] = ()) -> frozenset[str]:
    """The main graph's nodes a user kept float32 (``b=True``, or under an excluded scope)."""
    in_scope = scope_test(scopes)
    return frozenset(
        node.name
        for node in graph_def.node
        if exclude_mark(node.attr) == EXCLUDE_USER or (in_scope is not None and in_scope(node.name))
    )


def mark_nodes_made_from(graph_def: Any, excluded: frozenset[str]) -> int:
    """After inlining: marks excluded (``b=True``) each main-graph node made from an excluded
    node or from its gradient; returns how many it marked. Changes ``graph_def`` in place.

    Why: Grappler's inliner also lowers ``While`` / ``If`` to ``Enter`` / ``Merge`` /
    ``Switch``... nodes, new nodes that carry no attr; they are named under the node they
    replace (``<while>/enter/_3``; ``Func/<call>/input/_7`` for an inlined call's inputs). A
    lowered loop of an excluded region, or the lowered gradient loop of one, was painted half.
    """
    if not excluded:
        return 0

    def made_from_excluded(name: str) -> bool:
        name = name.removeprefix("Func/")
        parts = name.split("/")
        return any("/".join(parts[:depth]) in excluded for depth in range(1, len(parts)))

    marked = 0
    for node in graph_def.node:
        if exclude_mark(node.attr) == EXCLUDE_USER:
            continue
        name = node.name
        if made_from_excluded(name) or is_gradient_of(name.removeprefix("Func/"), excluded):
            node.attr[EXCLUDE_ATTR].b = True
            marked += 1
    return marked


def gradient_functions(functions: Collection[str]) -> dict[str, list[str]]:
    """{forward function: the gradient functions while_v2 / cond_v2 made of it}, by their
    naming rule ("<forward>_grad_<uid>").

    Why: the gradient of an excluded loop or branch is a ``While`` / ``If`` of its own, built
    in the gradient graph (often inside another loop's gradient body) under a name no
    exclusion covers; its functions are found by the forward function's name instead.
    """
    found: dict[str, list[str]] = {}
    for name in functions:
        match = _GRADIENT_FUNCTION.match(name)
        if match is not None and match.group(1) in functions:
            found.setdefault(match.group(1), []).append(name)
    return found


def called_functions(node: Any, functions: Collection[str]) -> list[str]:
    """The library functions (of ``functions``' names) ``node`` calls: its op, or its
    function attrs (While / If bodies, a call's ``f``)."""
    found = [node.op] if node.op in functions else []
    found += function_attr_names(node)
    return [name for name in found if name in functions]


def input_pipeline_functions(graph_def: Any) -> frozenset[str]:
    """The library functions of ``graph_def`` that run in a tf.data input pipeline, which the
    rewrite leaves as they are, as TensorFlow's pass does.

    Grappler's meta optimizer skips every function marked ``_tf_data_function`` (a ``map``,
    ``filter`` or ``interleave`` function: tf.data optimizes them itself), and its GPU pass leaves
    them float32. They run on the host CPU, where half kernels are slow. Also left: the
    functions only such functions call; one that a rewritten body calls too is one body,
    rewritten.

    Not left: a ``ReduceDataset``'s or ``ScanDataset``'s function (:data:`DATASET_LOOP_OPS`).
    It is the body of a loop over a dataset (``for x in dataset:`` in a ``tf.function``, which
    AutoGraph turns into a scan and a reduce, or ``Dataset.reduce``), where a training loop's
    model runs: TensorFlow's pass leaves it float32, which took a whole ``tf.function``
    training loop out of mixed precision. It is rewritten as a loop body, its running state
    under the accumulator guard (a reduce summing in half lost its addends: 30.0006 came out
    4.0 in bfloat16).
    """
    library = graph_def.library.function
    functions = {f.signature.name: f for f in library}
    loops = dataset_loop_bodies(graph_def)
    marked = {
        name for name, f in functions.items()
        if "_tf_data_function" in f.attr and f.attr["_tf_data_function"].b and name not in loops
    }
    if not marked:
        return frozenset()
    callees = {
        name: {c for node in f.node_def for c in called_functions(node, functions)}
        for name, f in functions.items()
    }
    left = set(marked)
    pending = list(marked)
    while pending:
        for callee in callees[pending.pop()]:
            if callee not in left:
                left.add(callee)
                pending.append(callee)
    from_main = {c for node in graph_def.node for c in called_functions(node, functions)}
    changed = True
    while changed:  # a callee of a rewritten body is rewritten, and so are its own callees
        changed = False
        for name in sorted(left - marked):
            if name in from_main or any(
                name in callees[caller] for caller in functions if caller not in left
            ):
                left.discard(name)
                changed = True
    return frozenset(left)


DATASET_LOOP_OPS = frozenset({"ReduceDataset", "ScanDataset"})
"""Dataset ops whose ``f`` is a loop body over the dataset: ``f(state..., element...)``
returns the next state first (a scan then its output), so its return ``k`` is its argument
``k``'s next value. AutoGraph runs ``for x in dataset:`` as a scan over the dataset, reduced."""


def dataset_loop_bodies(graph_def: Any) -> dict[str, int]:
    """The functions a :data:`DATASET_LOOP_OPS` node runs (main graph or library), each with
    the number of state values it takes and returns first (its ``Tstate``)."""
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return {
        node.attr["f"].func.name: len(node.attr["Tstate"].list.type)
        for node in nodes
        if node.op in DATASET_LOOP_OPS and node.attr["f"].func.name
    }
