"""The data edges of a body: input strings resolved to (node, port) pairs and joined vertices.

Every data input of every node becomes one edge (``e_src``/``e_sport`` -> ``e_dst``/``e_dport``,
plus its position in ``NodeDef.input`` so the cast planner can rewrite that string). When both
ends of an edge are float32 ports, their vertices are joined (``fanin``/``fanout``): that is
the graph the painter's passes walk. Malformed inputs raise ``GraphRewriteError`` here, before
anything is changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tf_amp.type_attrs.body_view import BodyView, GraphRewriteError
from tf_amp.type_attrs.op_info import out_arg_offsets


class InputResolver:
    """Resolves one body's input strings to ``(source node, flat output port)``.

    Graph bodies write ``name`` or ``name:port``; FunctionDefs write ``name`` (an argument) or
    ``node:out_arg:i``, whose port depends on the source node's output layout (cached per
    source node: a node read by many consumers is laid out once).
    """

    __slots__ = ("_view", "_function_name", "_offsets")

    def __init__(self, view: BodyView, fdef: Any = None) -> None:
        self._view = view
        self._function_name = fdef.signature.name if fdef is not None else None
        self._offsets: dict[int, dict[str, int]] = {}

    def __call__(self, text: str, consumer: str) -> tuple[int, int]:
        if self._function_name is not None:
            return self._function_input(text, consumer)
        return self._graph_input(text, consumer)

    def _graph_input(self, text: str, consumer: str) -> tuple[int, int]:
        index = self._view.index
        name, sep, port = text.rpartition(":")
        if sep and port.isdigit():
            src = index.get(name)
            p = int(port)
        else:
            src = index.get(text)
            p = 0
        if src is None:
            raise GraphRewriteError(f"Node {consumer!r} has input {text!r} that names no node")
        return src, p

    def _function_input(self, text: str, consumer: str) -> tuple[int, int]:
        view = self._view
        parts = text.split(":")
        src = view.index.get(parts[0])
        if src is None:
            raise GraphRewriteError(
                f"Node {consumer!r} in function {self._function_name!r} has input {text!r} "
                f"that names no node or argument"
            )
        if len(parts) == 1:
            return src, 0
        if len(parts) != 3 or not parts[2].isdigit():
            raise GraphRewriteError(f"Malformed function input {text!r} of {consumer!r}")
        sinfo = view.infos[src]
        if sinfo is None:
            # Unknown op: assume one output per referenced arg name, in order of appearance.
            return src, int(parts[2])
        offsets = self._offsets.get(src)
        if offsets is None:
            offsets = out_arg_offsets(sinfo, view.protos[src])
            self._offsets[src] = offsets
        base = offsets.get(parts[1])
        if base is None:
            raise GraphRewriteError(
                f"Input {text!r} of {consumer!r}: op {view.ops[src]} has no output {parts[1]!r}"
            )
        return src, base + int(parts[2])


def empty_neighbour_lists(view: BodyView) -> None:
    """Gives every vertex an empty ``fanin``/``fanout``.

    A vertex's neighbour list is created by its first edge, one slot long ([v], not [] then
    append, which reserves four); vertices without edges share the empty tuple. Less memory,
    so fewer fresh pages and cache misses on big graphs. Add edges with ``BodyView.add_edge``.
    """
    nv = view.num_vertices
    fanin: list[Sequence[int]] = [()] * nv
    fanout: list[Sequence[int]] = [()] * nv
    view.fanin, view.fanout = fanin, fanout


def add_data_edges(view: BodyView, real_ids: list[int], resolve: InputResolver) -> None:
    """One edge per data input of every real node, checking each against the op's arity.

    ``real_ids`` are the real nodes' numbers as the name index holds them (shared int objects:
    a fresh int per stored number would cost 28 bytes each). The loop is the hot path of the
    whole rewrite on big graphs, so it works on local names and inlines ``add_edge``.
    """
    names, ops, protos, index = view.names, view.ops, view.protos, view.index
    in_ports, out_ports, in_v, out_v = view.in_ports, view.out_ports, view.in_v, view.out_v
    fanin, fanout = view.fanin, view.fanout
    e_src, e_sport, e_dst, e_dport = view.e_src, view.e_sport, view.e_dst, view.e_dport
    e_pos = view.e_pos
    # FunctionDef syntax, or no two nodes to compare: always the general path.
    by_text_only = view.is_function or view.num_real < 2
    for i in real_ids:
        inputs = protos[i].input
        if not inputs:
            continue
        ins_i = in_ports[i]
        vin = in_v[i]
        q = 0
        for position, text in enumerate(inputs):
            if text[:1] == "^":
                if text[1:] not in index:
                    raise GraphRewriteError(
                        f"Node {names[i]!r} has control input {text!r} that names no node"
                    )
                continue
            # Fast paths (graph bodies): most inputs are "name" (port 0), and many name one of
            # the two nodes written just before (42-52% of the data edges of the traced
            # graphs in tests/_model_graphs.py; 93% in bench/rewrite_speed's chain; none in a
            # graph inlined by Grappler, where a miss costs two short string compares). A
            # compare with a cache-hot neighbour's name is cheaper than a probe into the index,
            # which misses the caches and the TLB on big graphs. Names are unique, so a match
            # is the index's answer. No per-edge bounds check: in a graph body ``names`` and
            # ``real_ids`` hold the real nodes alone, so for the first nodes index -1 and -2
            # name the last nodes in both (a match is still the right node); graphs of fewer
            # than two nodes take the general path.
            if by_text_only:
                src = None
            elif text == names[i - 1]:
                src = real_ids[i - 1]
            elif text == names[i - 2]:
                src = real_ids[i - 2]
            else:
                src = index.get(text)
            if src is not None:
                p = 0
            else:
                src, p = resolve(text, names[i])
            if ins_i is not None and q >= len(ins_i):
                raise GraphRewriteError(
                    f"Node {names[i]!r} ({ops[i]}) has more data inputs than its op allows"
                )
            souts = out_ports[src]
            if souts is not None and p >= len(souts):
                raise GraphRewriteError(
                    f"Node {names[i]!r} reads output {p} of {names[src]!r} ({ops[src]}), which "
                    f"has only {len(souts)} output(s)"
                )
            e_src.append(src)
            e_sport.append(p)
            e_dst.append(i)
            e_dport.append(q)
            e_pos.append(position)
            if vin:
                dv = vin[q]
                if dv >= 0:
                    sv_list = out_v[src]
                    sv = sv_list[p] if p < len(sv_list) else -1
                    if sv >= 0:  # view.add_edge(sv, dv), inlined: once per edge
                        targets = fanout[sv]
                        if targets:
                            targets.append(dv)
                        else:
                            fanout[sv] = [dv]
                        sources = fanin[dv]
                        if sources:
                            sources.append(sv)
                        else:
                            fanin[dv] = [sv]
            q += 1
        if ins_i is not None and q != len(ins_i):
            raise GraphRewriteError(
                f"Node {names[i]!r} ({ops[i]}) has {q} data input(s) but its op expects "
                f"{len(ins_i)}"
            )
