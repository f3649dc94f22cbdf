"""The node attr that keeps a node float32 whatever the lists say, and how to read it.

Set by users (``tf_amp.keep_float32``, exclude scopes in a traced function) and by the cast
planner (on the float32 view a name-preserving rewrite leaves under an op's old name). Read
while the vertex view is built, so the painter needs no second sweep over the attr maps.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

EXCLUDE_ATTR = "_tf_amp_exclude"  # node attr: never convert this node
_FORWARD_FUNCTION = "forward_function_name"  # a tape's backward function's attr
# The attr's two values: ``b=True`` is the user's (``tf_amp.keep_float32``, exclude scopes in a
# traced function), and its gradient ops are kept float32 too; ``s=FLOAT32_VIEW`` marks the
# float32 view the rewriter leaves under an op's old name in name-preserving mode, which no
# later rewrite may paint but which excludes nothing else. One attr, so telling them apart
# costs no second lookup per node.
FLOAT32_VIEW = b"float32-view"
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
    scopes = tuple(s.rstrip("/") for s in scopes if s.strip("/"))
    prefixes = tuple(s + "/" for s in scopes)
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
        if prefixes and (node.name in scopes or node.name.startswith(prefixes))
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


def called_functions(node: Any, functions: Collection[str]) -> list[str]:
    """The library functions (of ``functions``' names) ``node`` calls: its op, or its
    function attrs (While / If bodies, a call's ``f``)."""
    found = [node.op] if node.op in functions else []
    for value in node.attr.values():
        if value.HasField("func"):
            found.append(value.func.name)
        elif value.HasField("list"):
            found.extend(f.name for f in value.list.func)
    return [name for name in found if name in functions]
