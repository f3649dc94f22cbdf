"""The (node, type-attr) vertex view of a graph body, built from the OpDef registry.

Why vertices and not nodes: one node can carry several independently typed tensors. ``Cast``
has ``SrcT`` and ``DstT``; ``FusedBatchNormV3`` has ``T`` (x, y) and ``U`` (scale, mean,
variance: float32 only); ``IdentityN`` has a ``list(type)`` whose every element is its own
input->output lane. The unit that can turn half is therefore a *vertex* = (node, type attr,
list element), and two vertices are joined when a tensor flows from a port governed by one to
a port governed by the other. Only float32 vertices are created: a float tensor can only flow
between float ports, so nothing else can ever be painted or connect two float vertices.

A *body* is either the main graph or one library FunctionDef; function bodies get pseudo-nodes
for their arguments (``_Arg``) and ``ret`` values (``_Retval``), fixed-typed like TensorFlow's,
so that the function boundary behaves like a node boundary and casts land inside the body.

Everything here is plain Python lists indexed by node / vertex number, built in one pass, with
OpDef-derived facts cached per op type: this is the hot loop of a 1M-node rewrite.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorflow.core.framework import types_pb2

from tf_amp._upstream.tensorflow import op_def_registry

DT_FLOAT = types_pb2.DT_FLOAT
DT_HALF = types_pb2.DT_HALF
DT_BFLOAT16 = types_pb2.DT_BFLOAT16
DT_VARIANT = types_pb2.DT_VARIANT
DT_RESOURCE = types_pb2.DT_RESOURCE
DT_FLOAT_REF = types_pb2.DT_FLOAT_REF
UNKNOWN_DTYPE = -1  # port of an op we know nothing about

EXCLUDE_ATTR = "_tf_amp_exclude"  # node attr: never convert this node
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

ARG_OP = "_Arg"
RETVAL_OP = "_Retval"


class GraphRewriteError(ValueError):
    """The input graph is malformed (duplicate names, dangling inputs, wrong arity).

    Raised before anything is changed: the rewrite never returns a half-rewritten graph.
    """


# A port descriptor: (attr name or "", list element or -1, fixed dtype or 0).
Port = tuple[str, int, int]


@dataclass(frozen=True)
class ArgInfo:
    """One input_arg / output_arg of an OpDef, reduced to what the layout needs."""

    name: str
    type_attr: str
    type_list_attr: str
    number_attr: str
    fixed_type: int
    is_ref: bool


@dataclass
class OpInfo:
    """Per-op-type facts from the OpDef (or a FunctionDef signature), computed once."""

    name: str
    in_args: tuple[ArgInfo, ...]
    out_args: tuple[ArgInfo, ...]
    type_attrs: tuple[str, ...]  # attrs of type "type"
    list_type_attrs: tuple[str, ...]  # attrs of type "list(type)"
    allowed: dict[str, frozenset[int] | None]
    defaults: dict[str, Any]
    is_function: bool = False
    touches_state: bool = False  # has a resource or ref port: reads/writes a variable
    has_func_attr: bool = False  # calls a function (While, If, PartitionedCall, ...)
    static_in: tuple[Port, ...] | None = None  # layout when no node attr affects it
    static_out: tuple[Port, ...] | None = None
    out_arg_offsets_static: dict[str, int] | None = None
    # Fast path for the common shape: one "type" attr, no list attrs, static layout.
    single_attr: str = ""
    single_in_pos: tuple[int, ...] = ()
    single_out_pos: tuple[int, ...] = ()


_OP_INFO_CACHE: dict[str, OpInfo | None] = {}


def _arg_info(arg: Any) -> ArgInfo:
    return ArgInfo(
        name=arg.name,
        type_attr=arg.type_attr,
        type_list_attr=arg.type_list_attr,
        number_attr=arg.number_attr,
        fixed_type=int(arg.type),
        is_ref=bool(arg.is_ref),
    )


def _static_layout(args: Sequence[ArgInfo]) -> tuple[Port, ...] | None:
    ports: list[Port] = []
    for arg in args:
        if arg.number_attr or arg.type_list_attr:
            return None
        ports.append((arg.type_attr, -1, 0) if arg.type_attr else ("", -1, arg.fixed_type))
    return tuple(ports)


def _make_op_info(name: str, op_def: Any, is_function: bool) -> OpInfo:
    in_args = tuple(_arg_info(a) for a in op_def.input_arg)
    out_args = tuple(_arg_info(a) for a in op_def.output_arg)
    type_attrs: list[str] = []
    list_type_attrs: list[str] = []
    allowed: dict[str, frozenset[int] | None] = {}
    defaults: dict[str, Any] = {}
    has_func_attr = False
    for attr in getattr(op_def, "attr", ()):
        if attr.type in ("func", "list(func)"):
            has_func_attr = True
        if attr.type == "type":
            type_attrs.append(attr.name)
        elif attr.type == "list(type)":
            list_type_attrs.append(attr.name)
        else:
            if attr.HasField("default_value"):
                defaults[attr.name] = attr.default_value
            continue
        types = attr.allowed_values.list.type if attr.HasField("allowed_values") else ()
        allowed[attr.name] = frozenset(types) if types else None
        if attr.HasField("default_value"):
            defaults[attr.name] = attr.default_value
    stateful_types = {DT_RESOURCE}
    touches = any(a.is_ref or a.fixed_type in stateful_types for a in in_args + out_args)
    static_out = _static_layout(out_args)
    offsets = None
    if static_out is not None:
        offsets = {a.name: i for i, a in enumerate(out_args)}
    static_in = _static_layout(in_args)
    single_attr = ""
    in_pos: tuple[int, ...] = ()
    out_pos: tuple[int, ...] = ()
    if len(type_attrs) == 1 and not list_type_attrs and None not in (static_in, static_out):
        single_attr = type_attrs[0]
        in_pos = tuple(i for i, port in enumerate(static_in or ()) if port[0] == single_attr)
        out_pos = tuple(i for i, port in enumerate(static_out or ()) if port[0] == single_attr)
    return OpInfo(
        name=name,
        in_args=in_args,
        out_args=out_args,
        type_attrs=tuple(type_attrs),
        list_type_attrs=tuple(list_type_attrs),
        allowed=allowed,
        defaults=defaults,
        is_function=is_function,
        touches_state=touches,
        has_func_attr=has_func_attr,
        static_in=static_in,
        static_out=static_out,
        out_arg_offsets_static=offsets,
        single_attr=single_attr,
        single_in_pos=in_pos,
        single_out_pos=out_pos,
    )


def registry_op_info(op: str) -> OpInfo | None:
    """OpInfo for a registered op type (cached), or None if TensorFlow does not know it."""
    try:
        return _OP_INFO_CACHE[op]
    except KeyError:
        pass
    op_def = op_def_registry.get(op)
    info = None if op_def is None else _make_op_info(op, op_def, is_function=False)
    _OP_INFO_CACHE[op] = info
    return info


def function_op_info(fdef: Any) -> OpInfo:
    """A library function called as an op: its signature has fixed-typed args only (after
    tracing), so its ports are boundaries the painter never crosses."""
    return _make_op_info(fdef.signature.name, fdef.signature, is_function=True)


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
    # per node, the _tf_amp_exclude attr as read while the node's attr map was open anyway
    # (EXCLUDE_NOT_READ: look at the proto; else ``exclude_mark``). Saves the painter a second
    # sweep over the attr maps, which costs more per node the bigger the graph (cache misses).
    exclude_attr: bytearray = field(default_factory=bytearray)

    @property
    def num_vertices(self) -> int:
        return len(self.v_node)

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
        value = _attr_value(proto, self.infos[node], attr)
        if value is None:
            return UNKNOWN_DTYPE
        if elem < 0:
            return int(value.type)
        types = value.list.type
        return int(types[elem]) if elem < len(types) else UNKNOWN_DTYPE


_NO_VERTICES: list[tuple[int, ...]] = [(-1,) * n for n in range(64)]


def _no_vertices(n: int) -> tuple[int, ...]:
    """A shared all -1 port map (read-only): most nodes have no float32 vertex."""
    return _NO_VERTICES[n] if n < 64 else (-1,) * n


_SIG1: dict[int, tuple[int]] = {}


def _sig1(dtype: int) -> tuple[int]:
    """Shared one-element signature tuples (one per dtype, not one per node)."""
    sig = _SIG1.get(dtype)
    if sig is None:
        sig = _SIG1[dtype] = (dtype,)
    return sig


def _ports_of(n: int, positions: tuple[int, ...], v: int) -> tuple[int, ...]:
    """Port -> vertex map for a single-attr node: ``v`` at ``positions``, -1 elsewhere.

    A tuple: read-only after the view is built, and 16 bytes smaller than a list."""
    if len(positions) == n:
        return (v,) * n
    ports = [-1] * n
    for p in positions:
        ports[p] = v
    return tuple(ports)


def _attr_value(proto: Any, info: OpInfo | None, attr: str) -> Any:
    attrs = proto.attr
    if attr in attrs:
        return attrs[attr]
    if info is not None:
        return info.defaults.get(attr)
    return None


def _layout(args: Sequence[ArgInfo], proto: Any, info: OpInfo) -> tuple[Port, ...]:
    ports: list[Port] = []
    for arg in args:
        if arg.type_list_attr:
            value = _attr_value(proto, info, arg.type_list_attr)
            count = len(value.list.type) if value is not None else 0
            ports.extend((arg.type_list_attr, i, 0) for i in range(count))
            continue
        count = 1
        if arg.number_attr:
            value = _attr_value(proto, info, arg.number_attr)
            count = int(value.i) if value is not None else 0
        port: Port = (arg.type_attr, -1, 0) if arg.type_attr else ("", -1, arg.fixed_type)
        ports.extend([port] * count)
    return tuple(ports)


def _out_offsets(info: OpInfo, proto: Any) -> dict[str, int]:
    if info.out_arg_offsets_static is not None:
        return info.out_arg_offsets_static
    offsets: dict[str, int] = {}
    pos = 0
    for arg in info.out_args:
        offsets[arg.name] = pos
        if arg.type_list_attr:
            value = _attr_value(proto, info, arg.type_list_attr)
            pos += len(value.list.type) if value is not None else 0
        elif arg.number_attr:
            value = _attr_value(proto, info, arg.number_attr)
            pos += int(value.i) if value is not None else 0
        else:
            pos += 1
    return offsets


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


def build_body_view(
    nodes: Sequence[Any],
    functions: dict[str, OpInfo],
    fdef: Any = None,
    columns: NodeColumns | None = None,
) -> BodyView:
    """Index one body. ``nodes`` are the (already copied) NodeDefs; ``fdef`` is the
    FunctionDef when the body is a function (its signature supplies ``_Arg``/``_Retval``).
    ``columns``, when given, is ``read_node_columns(nodes)`` (taken over, not copied), so
    the protos are swept once.

    Raises GraphRewriteError for duplicate names, dangling inputs and wrong input arity.
    """
    is_function = fdef is not None
    if columns is None:
        columns = read_node_columns(nodes)
    n_real = len(columns.protos)
    names = columns.names
    ops = columns.ops
    protos = columns.protos
    devices = columns.devices
    arg_names: list[str] = []
    if is_function:
        sig = fdef.signature
        for arg in sig.input_arg:
            names.append(arg.name)
            ops.append(ARG_OP)
            protos.append(None)
            devices.append("")
            arg_names.append(arg.name)
    index: dict[str, int] = dict(zip(names, range(len(names)), strict=True))  # at C speed
    if len(index) != len(names):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise GraphRewriteError(f"Duplicate node name {name!r} in the graph")
            seen.add(name)

    infos: list[OpInfo | None] = []
    in_ports: list[tuple[Port, ...] | None] = []
    out_ports: list[tuple[Port, ...] | None] = []
    node_sig: list[tuple[Any, ...]] = []
    view = BodyView(
        is_function=is_function,
        names=names,
        ops=ops,
        protos=protos,
        num_real=n_real,
        infos=infos,
        devices=devices,
        in_ports=in_ports,
        out_ports=out_ports,
        node_sig=node_sig,
        index=index,
    )
    v_node, v_attr, v_elem = view.v_node, view.v_attr, view.v_elem
    exclude_attr = view.exclude_attr = bytearray(len(names))
    in_v, out_v = view.in_v, view.out_v
    empty: tuple[Any, ...] = ()
    # The int objects the index holds, shared by every list below that stores a node number
    # (v_node, e_dst): a fresh int per stored number would cost 28 bytes each.
    real_ids = list(index.values())[:n_real]
    # ---- per node: op info, port layout, float32 vertices
    for i in real_ids:
        proto = protos[i]
        op = ops[i]
        info = functions.get(op)
        if info is None:
            info = registry_op_info(op)
        infos.append(info)
        if info is None:
            view.unknown_ops.append(i)
            in_ports.append(None)
            out_ports.append(None)
            node_sig.append(empty)
            in_v.append([])
            out_v.append([])
            continue
        ins = info.static_in if info.static_in is not None else _layout(info.in_args, proto, info)
        outs = (
            info.static_out if info.static_out is not None else _layout(info.out_args, proto, info)
        )
        in_ports.append(ins)
        out_ports.append(outs)
        if not info.type_attrs and not info.list_type_attrs:
            node_sig.append(empty)
            in_v.append(_no_vertices(len(ins)))
            out_v.append(_no_vertices(len(outs)))
            continue
        attrs = proto.attr
        exclude_attr[i] = exclude_mark(attrs)
        single = info.single_attr
        if single:
            value = attrs.get(single)
            if value is None:
                value = info.defaults.get(single)
            dtype = value.type if value is not None else 0
            node_sig.append(_sig1(dtype))
            if dtype != DT_FLOAT:
                in_v.append(_no_vertices(len(ins)))
                out_v.append(_no_vertices(len(outs)))
                continue
            v = len(v_node)
            v_node.append(i)
            v_attr.append(single)
            v_elem.append(-1)
            in_v.append(_ports_of(len(ins), info.single_in_pos, v))
            out_v.append(_ports_of(len(outs), info.single_out_pos, v))
            continue
        sig: list[Any] = []
        local: dict[tuple[str, int], int] = {}
        for name in info.type_attrs:
            value = attrs[name] if name in attrs else info.defaults.get(name)
            dtype = int(value.type) if value is not None else 0
            sig.append(dtype)
            if dtype == DT_FLOAT:
                local[(name, -1)] = len(v_node)
                v_node.append(i)
                v_attr.append(name)
                v_elem.append(-1)
        for name in info.list_type_attrs:
            value = attrs[name] if name in attrs else info.defaults.get(name)
            types = tuple(value.list.type) if value is not None else ()
            sig.append(types)
            for k, dtype in enumerate(types):
                if dtype == DT_FLOAT:
                    local[(name, k)] = len(v_node)
                    v_node.append(i)
                    v_attr.append(name)
                    v_elem.append(k)
        node_sig.append(tuple(sig))
        if local:
            in_v.append(tuple([local.get((a, e), -1) if a else -1 for a, e, _ in ins]))
            out_v.append(tuple([local.get((a, e), -1) if a else -1 for a, e, _ in outs]))
        else:
            in_v.append(_no_vertices(len(ins)))
            out_v.append(_no_vertices(len(outs)))
    # ---- pseudo nodes for function args
    if is_function:
        for arg in fdef.signature.input_arg:
            infos.append(None)
            in_ports.append(())
            out_ports.append((("", -1, int(arg.type) if not arg.type_attr else UNKNOWN_DTYPE),))
            node_sig.append(empty)
            in_v.append([])
            out_v.append([-1])
    nv = len(v_node)
    # A vertex's neighbour list is created by its first edge, one slot long ([v], not [] then
    # append, which reserves four); vertices without edges share the empty tuple. Less
    # memory, so fewer fresh pages and cache misses on big graphs. Add edges with add_edge.
    fanin: list[Sequence[int]] = [()] * nv
    fanout: list[Sequence[int]] = [()] * nv
    view.fanin, view.fanout = fanin, fanout
    e_src, e_sport, e_dst, e_dport = view.e_src, view.e_sport, view.e_dst, view.e_dport
    e_pos = view.e_pos
    offsets_cache: dict[int, dict[str, int]] = {}

    def resolve(text: str, consumer: str) -> tuple[int, int]:
        if is_function:
            parts = text.split(":")
            src = index.get(parts[0])
            if src is None:
                raise GraphRewriteError(
                    f"Node {consumer!r} in function {fdef.signature.name!r} has input {text!r} "
                    f"that names no node or argument"
                )
            if len(parts) == 1:
                return src, 0
            if len(parts) != 3 or not parts[2].isdigit():
                raise GraphRewriteError(f"Malformed function input {text!r} of {consumer!r}")
            sinfo = infos[src]
            if sinfo is None:
                # Unknown op: assume one output per referenced arg name, in order of appearance.
                return src, int(parts[2])
            offsets = offsets_cache.get(src)
            if offsets is None:
                offsets = _out_offsets(sinfo, protos[src])
                offsets_cache[src] = offsets
            base = offsets.get(parts[1])
            if base is None:
                raise GraphRewriteError(
                    f"Input {text!r} of {consumer!r}: op {ops[src]} has no output {parts[1]!r}"
                )
            return src, base + int(parts[2])
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

    # ---- data edges
    by_text_only = is_function or n_real < 2  # FunctionDef syntax, or no two nodes to compare
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
            # graphs in _model_graphs; 93% in bench/rewrite_speed's chain; none in a graph
            # inlined by Grappler, where a miss costs two short string compares). A compare
            # with a cache-hot neighbour's name is cheaper than a probe into the index, which
            # misses the caches and the TLB on big graphs. Names are unique, so a match is
            # the index's answer. No per-edge bounds check: in a graph body ``names`` and
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
    # ---- function ret values become _Retval pseudo nodes
    if is_function:
        out_types = {a.name: a for a in fdef.signature.output_arg}
        for key in sorted(fdef.ret):
            r = len(names)
            names.append("ret:" + key)
            ops.append(RETVAL_OP)
            protos.append(None)
            devices.append("")
            infos.append(None)
            arg = out_types.get(key)
            dtype = UNKNOWN_DTYPE if arg is None or arg.type_attr else int(arg.type)
            in_ports.append((("", -1, dtype),))
            out_ports.append(())
            node_sig.append(empty)
            in_v.append([-1])
            out_v.append([])
            view.ret_keys.append(key)
            src, p = resolve(fdef.ret[key], "ret " + key)
            e_src.append(src)
            e_sport.append(p)
            e_dst.append(r)
            e_dport.append(0)
            e_pos.append(0)
    return view
