"""``build_body_view``: index one body in four steps, each in its own function.

1. names: the node columns, plus one ``_Arg`` pseudo-node per function argument, indexed by
   name (a duplicate name is an error);
2. vertices: per real node its op facts, port layout and float32 vertices
   (``tf_amp.type_attrs.vertices``); then the argument pseudo-nodes' fixed-typed ports;
3. edges: every data input resolved and checked (``tf_amp.type_attrs.edges``);
4. function ``ret`` values: one ``_Retval`` pseudo-node each, with its edge;
5. no cycle but through a loop's back edge (``NextIteration``): TensorFlow refuses such a
   graph ("N nodes in a cycle"), so painting it would only hide the fault.

The pseudo-nodes make a function's boundary behave like a node boundary, fixed-typed like
TensorFlow's own ``_Arg``/``_Retval``: casts land inside the body and the signature (and every
call site) stays valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tf_amp.type_attrs.body_view import (
    ARG_OP,
    RETVAL_OP,
    BodyView,
    GraphRewriteError,
    NodeColumns,
    read_node_columns,
)
from tf_amp.type_attrs.edges import InputResolver, add_data_edges, empty_neighbour_lists
from tf_amp.type_attrs.op_info import UNKNOWN_DTYPE, OpInfo
from tf_amp.type_attrs.vertices import add_node_vertices


def build_body_view(
    nodes: Sequence[Any],
    functions: dict[str, OpInfo],
    fdef: Any = None,
    columns: NodeColumns | None = None,
    check_cycles: bool = True,
) -> BodyView:
    """Index one body. ``nodes`` are the (already copied) NodeDefs; ``fdef`` is the
    FunctionDef when the body is a function (its signature supplies ``_Arg``/``_Retval``).
    ``columns``, when given, is ``read_node_columns(nodes)`` (taken over, not copied), so
    the protos are swept once. ``check_cycles=False`` skips step 5, for graphs TensorFlow
    built.

    Raises GraphRewriteError for duplicate names, dangling inputs, wrong input arity and a
    data cycle that does not pass through a ``NextIteration``.
    """
    if columns is None:
        columns = read_node_columns(nodes)
    n_real = len(columns.protos)
    if fdef is not None:
        _append_arg_names(columns, fdef)
    index = _name_index(columns.names)
    view = BodyView(
        is_function=fdef is not None,
        names=columns.names,
        ops=columns.ops,
        protos=columns.protos,
        num_real=n_real,
        infos=[],
        devices=columns.devices,
        in_ports=[],
        out_ports=[],
        node_sig=[],
        index=index,
    )
    view.exclude_attr = bytearray(len(columns.names))
    # The int objects the index holds, shared by every list that stores a node number
    # (v_node, e_dst): a fresh int per stored number would cost 28 bytes each.
    real_ids = list(index.values())[:n_real]
    add_node_vertices(view, real_ids, functions)
    if fdef is not None:
        _add_arg_ports(view, fdef)
    empty_neighbour_lists(view)
    resolve = InputResolver(view, fdef)
    add_data_edges(view, real_ids, resolve)
    if fdef is not None:
        _add_retval_nodes(view, fdef, resolve)
    if check_cycles:
        _refuse_cycles(view)
    return view


def _append_arg_names(columns: NodeColumns, fdef: Any) -> None:
    """One ``_Arg`` pseudo-node per function argument, after the real nodes."""
    for arg in fdef.signature.input_arg:
        columns.names.append(arg.name)
        columns.ops.append(ARG_OP)
        columns.protos.append(None)
        columns.devices.append("")


def _name_index(names: list[str]) -> dict[str, int]:
    """{name: node number}; raises GraphRewriteError naming the first duplicate."""
    index: dict[str, int] = dict(zip(names, range(len(names)), strict=True))  # at C speed
    if len(index) != len(names):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise GraphRewriteError(f"Duplicate node name {name!r} in the graph")
            seen.add(name)
    return index


def _add_arg_ports(view: BodyView, fdef: Any) -> None:
    """Each ``_Arg`` pseudo-node has one output of the argument's fixed type, no vertex."""
    for arg in fdef.signature.input_arg:
        view.infos.append(None)
        view.in_ports.append(())
        view.out_ports.append((("", -1, int(arg.type) if not arg.type_attr else UNKNOWN_DTYPE),))
        view.node_sig.append(())
        view.in_v.append([])
        view.out_v.append([-1])


def _add_retval_nodes(view: BodyView, fdef: Any, resolve: InputResolver) -> None:
    """One ``_Retval`` pseudo-node per ``ret`` key (sorted), fed by the value it returns."""
    out_types = {a.name: a for a in fdef.signature.output_arg}
    view.ret_positions = {a.name: i for i, a in enumerate(fdef.signature.output_arg)}
    for key in sorted(fdef.ret):
        r = len(view.names)
        view.names.append("ret:" + key)
        view.ops.append(RETVAL_OP)
        view.protos.append(None)
        view.devices.append("")
        view.infos.append(None)
        arg = out_types.get(key)
        dtype = UNKNOWN_DTYPE if arg is None or arg.type_attr else int(arg.type)
        view.in_ports.append((("", -1, dtype),))
        view.out_ports.append(())
        view.node_sig.append(())
        view.in_v.append([-1])
        view.out_v.append([])
        view.ret_keys.append(key)
        src, p = resolve(fdef.ret[key], "ret " + key)
        view.e_src.append(src)
        view.e_sport.append(p)
        view.e_dst.append(r)
        view.e_dport.append(0)
        view.e_pos.append(0)


_BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})


def _refuse_cycles(view: BodyView) -> None:
    """Raises GraphRewriteError naming the nodes of a data cycle that no loop back edge breaks.

    Most graphs list every node after its inputs (graph construction does), so one sweep
    showing that each edge runs forward settles it (a tenth of the cost of a full walk on
    100k nodes). Else Kahn's algorithm over the data edges, leaving out those from
    ``NextIteration`` (a v1 while loop's only legal cycle): nodes never freed lie on a cycle
    or after one. ``_Arg`` pseudo-nodes come after the real nodes but have no inputs.
    """
    n = len(view.names)
    ops = view.ops
    e_src, e_dst = view.e_src, view.e_dst
    num_real = view.num_real
    if all(
        src < dst or src >= num_real or ops[src] in _BACK_EDGE_OPS
        for src, dst in zip(e_src, e_dst, strict=True)
    ):
        return
    succ: list[list[int]] = [[] for _ in range(n)]
    pending = [0] * n
    for src, dst in zip(e_src, e_dst, strict=True):
        if ops[src] in _BACK_EDGE_OPS:
            continue
        succ[src].append(dst)
        pending[dst] += 1
    ready = [i for i in range(n) if not pending[i]]
    freed = 0
    while ready:
        node = ready.pop()
        freed += 1
        for dst in succ[node]:
            pending[dst] -= 1
            if not pending[dst]:
                ready.append(dst)
    if freed == n:
        return
    cycle = _one_cycle(view, pending)
    raise GraphRewriteError(
        f"The graph has a cycle that no NextIteration breaks: {' -> '.join(cycle)} "
        "(TensorFlow refuses such a graph too)"
    )


def _one_cycle(view: BodyView, pending: list[int]) -> list[str]:
    """Names one cycle among the nodes Kahn's algorithm could not free (``pending`` > 0):
    each has a pending predecessor, so walking predecessors must come round."""
    pred: dict[int, int] = {}
    for src, dst in zip(view.e_src, view.e_dst, strict=True):
        if pending[dst] and pending[src] and view.ops[src] not in _BACK_EDGE_OPS:
            pred.setdefault(dst, src)
    node = next(i for i, count in enumerate(pending) if count)
    seen: dict[int, int] = {}
    path: list[int] = []
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = pred[node]
    loop = path[seen[node]:][::-1]  # predecessors were walked: reverse to data order
    return [view.names[i] for i in loop + loop[:1]]
