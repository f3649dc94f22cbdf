"""TensorList clusters: lists that share a handle get one element type.

A TensorList's element type is a type attr on every op that touches the list (``element_dtype``),
and all of them must agree, or the list fails at run time. The handle (a ``DT_VARIANT`` tensor)
ties them together: vertices are grouped by handle with a union-find over variant edges, each
group painted one colour. A group whose handle crosses a function call, a feed or a
control-flow op is denied: the code on the other side is not rewritten consistently with it.
Writers get implicit edges to readers, so colour flows through a list as through a tensor.
"""

from __future__ import annotations

from collections.abc import Callable

from tf_amp.painter.colours import ALLOW_C, DENY_C
from tf_amp.painter.reasons import Block, Reason
from tf_amp.painter.state import PaintState
from tf_amp.type_attrs import ARG_OP, DT_VARIANT, RETVAL_OP, BodyView

# TensorList handles that reach these cannot be followed: the list is shared with code this
# rewrite of this body cannot see (another function, a feed, a control-flow body).
_TENSOR_LIST_SINKS: frozenset[str] = frozenset(
    {
        ARG_OP,
        RETVAL_OP,
        "Placeholder",
        "PartitionedCall",
        "StatefulPartitionedCall",
        "OptionalFromValue",
        "OptionalGetValue",
        "While",
        "StatelessWhile",
        "If",
        "StatelessIf",
        "Case",
        "StatelessCase",
    }
)
_TENSOR_LIST_WRITERS: frozenset[str] = frozenset(
    {
        "TensorListFromTensor",
        "TensorListPushBack",
        "TensorListPushBackBatch",
        "TensorListScatter",
        "TensorListScatterV2",
        "TensorListScatterIntoExistingList",
        "TensorListSetItem",
        "TensorListSplit",
    }
)
_TENSOR_LIST_READERS: frozenset[str] = frozenset(
    {
        "TensorListConcat",
        "TensorListConcatV2",
        "TensorListGather",
        "TensorListGetItem",
        "TensorListPopBack",
        "TensorListStack",
    }
)


def find_tensor_list_clusters(state: PaintState) -> list[list[int]]:
    """Group float32 TensorList element-type vertices by shared handle (union-find over
    DT_VARIANT edges). Unsafe clusters are painted deny. Also adds implicit writer ->
    reader edges so that colour flows through a list like through a tensor."""
    view = state.view
    members = [
        v
        for v in range(view.num_vertices)
        if view.v_attr[v] == "element_dtype" and "TensorList" in view.ops[view.v_node[v]]
    ]
    if not members:
        return []
    preserved = [block == Block.PRESERVED for block in state.node_block]
    find, unsafe_roots = _join_handles(view, preserved)
    clusters: dict[int, list[int]] = {}
    for v in members:
        root = find(view.v_node[v])
        clusters.setdefault(root, []).append(v)
        if not state.node_eligible[view.v_node[v]]:
            unsafe_roots.add(root)
    result = []
    denied = 0
    for root, cluster in sorted(clusters.items()):
        if root in unsafe_roots:
            for v in cluster:
                state.paint(v, DENY_C, Reason.TENSOR_LIST_UNSAFE)
                denied += 1
        writers = [v for v in cluster if view.ops[view.v_node[v]] in _TENSOR_LIST_WRITERS]
        readers = [v for v in cluster if view.ops[view.v_node[v]] in _TENSOR_LIST_READERS]
        for w in writers:
            for r in readers:
                view.add_edge(w, r)
        result.append(cluster)
    state.count("find_tensor_list_clusters(denied)", denied)
    return result


def _join_handles(
    view: BodyView, preserved: list[bool]
) -> tuple[Callable[[int], int], set[int]]:
    """Union-find over the nodes joined by variant (handle) edges: (the root finder, the roots
    of groups whose handle touches a sink).

    Handles are followed through ordinary nodes (Identity, Switch, Merge, Enter, ...) but not
    through sinks: lists on the two sides of a While/If/call stay separate clusters, each
    denied because it touches the boundary. A preserved node (a fetch: the output Identity of
    a ``tf_amp.function`` returning a TensorArray) is a sink too: the caller reads the list
    with the element type the graph promised.
    """
    parent = list(range(len(view.names)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def is_sink(n: int) -> bool:
        if view.ops[n] in _TENSOR_LIST_SINKS:
            return True
        if n >= view.num_real:
            return False
        if preserved[n]:
            return True
        info = view.infos[n]
        return info is None or info.is_function or info.has_func_attr

    touching_sink: list[int] = []
    for k in range(len(view.e_src)):
        s, p = view.e_src[k], view.e_sport[k]
        if view.port_dtype(s, p, output=True) != DT_VARIANT:
            continue
        d = view.e_dst[k]
        s_sink, d_sink = is_sink(s), is_sink(d)
        if s_sink or d_sink:
            if not s_sink:
                touching_sink.append(s)
            if not d_sink:
                touching_sink.append(d)
            continue
        a, b = find(s), find(d)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return find, {find(n) for n in touching_sink}


def force_tensor_list_colour_match(state: PaintState, clusters: list[list[int]]) -> None:
    """All vertices of a TensorList cluster take one colour: deny if any is deny, else
    allow if any is allow."""
    n = 0
    for cluster in clusters:
        deny = [v for v in cluster if state.colour[v] == DENY_C]
        allow = [v for v in cluster if state.colour[v] == ALLOW_C]
        if deny:
            for v in cluster:
                if state.colour[v] != DENY_C:
                    state.paint(v, DENY_C, Reason.TENSOR_LIST_MATCH_DENY, deny[0])
                    n += 1
        elif allow:
            for v in cluster:
                if state.colour[v] != ALLOW_C:
                    state.paint(v, ALLOW_C, Reason.TENSOR_LIST_MATCH_ALLOW, allow[0])
                    n += 1
    state.count("force_tensor_list_colour_match", n)
