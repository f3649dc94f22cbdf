"""The indexed form of one body (the main graph or a library function): ``BodyView``.

Everything is a plain Python list indexed by node or vertex number (parallel columns, not an
object per node): on 100k-node graphs an object per node and per vertex costs more memory and
more cache misses than the rewrite's own work. ``build_body_view`` (``tf_amp.type_attrs.build``)
fills it; the painter, the cast planner and the report only read it (the painter adds the
TensorList writer -> reader edges through ``add_edge``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tf_amp.type_attrs.op_info import UNKNOWN_DTYPE, OpInfo, Port, attr_value

ARG_OP = "_Arg"
RETVAL_OP = "_Retval"


class GraphRewriteError(ValueError):
    """The input graph is malformed (duplicate names, dangling inputs, wrong arity).

    Raised before anything is changed: the rewrite never returns a half-rewritten graph.
    """


_DEVICE_RE = re.compile(r"(?:device:)?([A-Za-z_]+):\d+$")
_DEVICE_CACHE: dict[str, str] = {}


def device_type(device: str, default: str) -> str:
    """"/job:x/replica:0/task:0/device:GPU:0" -> "GPU"; "" -> default."""
    if not device:
        return default
    cached = _DEVICE_CACHE.get(device)
    if cached is not None:
        return cached
    last = device.rstrip("/").rsplit("/", 1)[-1]
    match = _DEVICE_RE.search(last)
    kind = match.group(1).upper() if match else default
    _DEVICE_CACHE[device] = kind
    return kind


@dataclass
class BodyView:
    """Vertices and edges of one body (graph or function).

    Node lists include pseudo-nodes (function ``_Arg`` / ``_Retval``) after the real nodes;
    ``num_real`` is the count of real NodeDefs. Ports are flat indices (FunctionDef's
    ``node:out_arg:i`` syntax is resolved to them).
    """

    is_function: bool
    names: list[str]
    ops: list[str]
    protos: list[Any]  # NodeDef for real nodes, None for pseudo nodes
    num_real: int
    infos: list[OpInfo | None]
    devices: list[str]
    in_ports: list[tuple[Port, ...] | None]
    out_ports: list[tuple[Port, ...] | None]
    node_sig: list[tuple[Any, ...]]  # current values of the node's type attrs (for kernels)
    # vertices
    v_node: list[int] = field(default_factory=list)
    v_attr: list[str] = field(default_factory=list)
    v_elem: list[int] = field(default_factory=list)
    in_v: list[Sequence[int]] = field(default_factory=list)  # node -> input port -> vertex/-1
    out_v: list[Sequence[int]] = field(default_factory=list)  # node -> output port -> vertex/-1
    fanin: list[Sequence[int]] = field(default_factory=list)  # () or a list: use add_edge
    fanout: list[Sequence[int]] = field(default_factory=list)
    # data edges (parallel lists) and the original input strings
    e_src: list[int] = field(default_factory=list)
    e_sport: list[int] = field(default_factory=list)
    e_dst: list[int] = field(default_factory=list)
    e_dport: list[int] = field(default_factory=list)
    e_pos: list[int] = field(default_factory=list)  # position of the edge in proto.input
    unknown_ops: list[int] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    ret_keys: list[str] = field(default_factory=list)  # function: ret key of each _Retval
    # function: ret key -> its position among the signature's outputs (a While body's
    # return k is the next value of its argument k)
    ret_positions: dict[str, int] = field(default_factory=dict)
    # per node, the _tf_amp_exclude attr as read while the node's attr map was open anyway
    # (EXCLUDE_NOT_READ: look at the proto; else ``exclude_mark``). Saves the painter a second
    # sweep over the attr maps, which costs more per node the bigger the graph (cache misses).
    exclude_attr: bytearray = field(default_factory=bytearray)
    # The tf.custom_gradient registry keys whose gradient functions the GraphDef's library
    # holds (a SavedModel's): TensorFlow calls those with the marking op's dtypes when the
    # rewritten graph is differentiated. Set by the rewriter for every body of a graph.
    saved_gradient_types: frozenset[str] = frozenset()
    # The body function of a While (set by the rewriter, which sees the loops that call it).
    is_loop_body: bool = False
    # The nodes of this body on a loop's running sum (``tf_amp.painter.accumulator_guard``, set
    # by the rewriter: the sum of a loop in one body can run through a branch function).
    running_sums: frozenset[int] = frozenset()

    @property
    def num_vertices(self) -> int:
        return len(self.v_node)

    def data_producers(self) -> dict[int, dict[int, tuple[int, int]]]:
        """consumer node -> input port -> (producer node, output port), data edges only: the
        backward walks of the painter's guards."""
        producers: dict[int, dict[int, tuple[int, int]]] = {}
        for src, sport, dst, dport in zip(
            self.e_src, self.e_sport, self.e_dst, self.e_dport, strict=True
        ):
            producers.setdefault(dst, {})[dport] = (src, sport)
        return producers

    def add_edge(self, source: int, target: int) -> None:
        """Joins two vertices (``fanout``/``fanin`` hold a shared ``()`` until a first edge)."""
        for lists, v, other in ((self.fanout, source, target), (self.fanin, target, source)):
            neighbours = lists[v]
            if neighbours:
                neighbours.append(other)
            else:
                lists[v] = [other]

    def edge_text(self, k: int, fdef: Any = None) -> str:
        """The input string of edge ``k`` as written in its consumer (``"x:1"``,
        ``"mm:product:0"``); read back from the proto instead of kept for every edge."""
        d = self.e_dst[k]
        if d < self.num_real:
            return self.protos[d].input[self.e_pos[k]]
        key = self.ret_keys[d - (len(self.names) - len(self.ret_keys))]
        return fdef.ret[key]

    def vertex_label(self, v: int) -> str:
        """Human-readable vertex name: ``node (Op) attr[elem]``."""
        n = self.v_node[v]
        elem = self.v_elem[v]
        attr = self.v_attr[v] if elem < 0 else f"{self.v_attr[v]}[{elem}]"
        return f"{self.names[n]} ({self.ops[n]}) {attr}"

    def port_dtype(self, node: int, port: int, output: bool) -> int:
        """Current dtype of a port (UNKNOWN_DTYPE if the op is unknown)."""
        ports = self.out_ports[node] if output else self.in_ports[node]
        if ports is None or port >= len(ports):
            return UNKNOWN_DTYPE
        attr, elem, fixed = ports[port]
        if not attr:
            return fixed
        proto = self.protos[node]
        value = attr_value(proto, self.infos[node], attr)
        if value is None:
            return UNKNOWN_DTYPE
        if elem < 0:
            return int(value.type)
        types = value.list.type
        return int(types[elem]) if elem < len(types) else UNKNOWN_DTYPE


@dataclass
class NodeColumns:
    """The NodeDefs of one body with their name, op and device read out into parallel lists.

    Read in one sweep over the protos (``read_node_columns``): on 100k-node graphs the NodeDefs
    no longer fit in the CPU caches, so every extra pass over the protos costs more per node the
    bigger the graph (three sweeps grew 1.3x faster than linear). Callers that must look at ops
    before the view is built (the FusedBatchNorm upgrade) use these lists instead of a sweep of
    their own, and keep ``ops`` in step with any op they change.
    """

    protos: list[Any]
    names: list[str]
    ops: list[str]
    devices: list[str]


def read_node_columns(nodes: Sequence[Any]) -> NodeColumns:
    """One pass over ``nodes`` collecting the proto wrappers, names, ops and devices."""
    protos: list[Any] = list(nodes)
    names: list[str] = []
    ops: list[str] = []
    devices: list[str] = []
    add_name, add_op, add_device = names.append, ops.append, devices.append
    intern = sys.intern
    for node in protos:
        add_name(node.name)
        # A graph has a few hundred distinct op types and devices: one shared string each,
        # not one per node (less memory, and the column stays in cache on big graphs).
        add_op(intern(node.op))
        add_device(intern(node.device))
    return NodeColumns(protos, names, ops, devices)
