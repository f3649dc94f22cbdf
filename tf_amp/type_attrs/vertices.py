"""The float32 vertices of each node: one per float32 type attr or typed-list element.

Per real node: its ``OpInfo``, the port layout of its inputs and outputs, the current values of
its type attrs (``node_sig``, which the kernel check reads), and a port -> vertex map for each
side (``in_v``/``out_v``, -1 where the port is not a float32 vertex). Only float32 vertices are
created: a float tensor can only flow between float ports, so nothing else can ever be painted
or connect two float vertices.

Most nodes have one ``type`` attr and a static layout (``OpInfo.single_attr``) and take the
fast path; read-only port maps are shared tuples, not fresh lists, since most nodes have no
float32 vertex at all.
"""

from __future__ import annotations

from typing import Any

from tf_amp.type_attrs.body_view import BodyView, GraphRewriteError
from tf_amp.type_attrs.exclude import exclude_mark
from tf_amp.type_attrs.op_info import DT_FLOAT, OpInfo, Port, node_layout, registry_op_info

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


def add_node_vertices(
    view: BodyView, real_ids: list[int], functions: dict[str, OpInfo]
) -> None:
    """Fills the per-node columns and the vertex lists for the real nodes, in node order.

    ``functions`` are the library's functions called as ops (``function_op_info``); any other
    op is looked up in TensorFlow's registry. An op neither knows is recorded in
    ``view.unknown_ops`` and gets no ports: the painter keeps it float32.
    """
    protos, ops = view.protos, view.ops
    infos, in_ports, out_ports, node_sig = view.infos, view.in_ports, view.out_ports, view.node_sig
    v_node, v_attr, v_elem = view.v_node, view.v_attr, view.v_elem
    exclude_attr = view.exclude_attr
    in_v, out_v = view.in_v, view.out_v
    empty: tuple[Any, ...] = ()
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
        ins = info.static_in if info.static_in is not None else node_layout(
            info.in_args, proto, info
        )
        outs = info.static_out if info.static_out is not None else node_layout(
            info.out_args, proto, info
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
        if not single:
            _add_typed_vertices(view, i, info, attrs, ins, outs)
            continue
        value = attrs.get(single)
        if value is None:
            value = _default_or_raise(view, i, info, single)
        dtype = value.type
        if not dtype:  # DT_INVALID: no type there (a list, an int...), or an invalid one
            _raise_if_not_a_type(view, i, single, value, "type")
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


def _default_or_raise(view: BodyView, i: int, info: OpInfo, attr: str) -> Any:
    """The op's default for a type attribute the node leaves out; without one the node is
    malformed (TensorFlow refuses to import it too), and guessing a dtype would let an op be
    painted, or skipped, for a type it does not have."""
    value = info.defaults.get(attr)
    if value is None:
        raise GraphRewriteError(
            f"Node {view.names[i]!r} ({view.ops[i]}) has no {attr!r} attribute, and its op "
            f"gives it no default"
        )
    return value


# AttrValue's oneof fields, in words
_ATTR_KINDS = {"s": "a string", "i": "an int", "f": "a float", "b": "a bool", "func": "a function",
               "list": "a list", "shape": "a shape", "tensor": "a tensor", "type": "a type",
               "placeholder": "a placeholder"}


def _raise_if_not_a_type(view: BodyView, i: int, attr: str, value: Any, kind: str) -> None:
    """A type attribute that holds something else (a list where a type belongs, an int, a
    string) or DT_INVALID: the node is malformed, and TensorFlow refuses to import it. Read as
    "not float32", it was skipped and the graph called "nothing to do"."""
    held = value.WhichOneof("value")
    if held == "placeholder" or (held == kind and (kind == "list" or value.type)):
        return  # a generic FunctionDef's attr reference, or an empty list(type): well formed
    what = "DT_INVALID" if held == kind else (
        f"{_ATTR_KINDS.get(held, held)} value" if held else "no value")
    want = "type" if kind == "type" else "list of types"
    raise GraphRewriteError(
        f"Node {view.names[i]!r} ({view.ops[i]}) has {what} in its {attr!r} attribute, "
        f"where its op expects a {want}"
    )


def _add_typed_vertices(
    view: BodyView,
    i: int,
    info: OpInfo,
    attrs: Any,
    ins: tuple[Port, ...],
    outs: tuple[Port, ...],
) -> None:
    """Vertices of a node with several type attrs or a typed list (``Cast``'s SrcT/DstT,
    ``FusedBatchNormV3``'s T/U, ``IdentityN``'s list): one per float32 attr or element."""
    v_node, v_attr, v_elem = view.v_node, view.v_attr, view.v_elem
    sig: list[Any] = []
    local: dict[tuple[str, int], int] = {}
    for name in info.type_attrs:
        value = attrs[name] if name in attrs else _default_or_raise(view, i, info, name)
        dtype = int(value.type)
        if not dtype:
            _raise_if_not_a_type(view, i, name, value, "type")
        sig.append(dtype)
        if dtype == DT_FLOAT:
            local[(name, -1)] = len(v_node)
            v_node.append(i)
            v_attr.append(name)
            v_elem.append(-1)
    for name in info.list_type_attrs:
        value = attrs[name] if name in attrs else _default_or_raise(view, i, info, name)
        types = tuple(value.list.type)
        if not types:
            _raise_if_not_a_type(view, i, name, value, "list")
        sig.append(types)
        for k, dtype in enumerate(types):
            if dtype == DT_FLOAT:
                local[(name, k)] = len(v_node)
                v_node.append(i)
                v_attr.append(name)
                v_elem.append(k)
    view.node_sig.append(tuple(sig))
    if local:
        view.in_v.append(tuple([local.get((a, e), -1) if a else -1 for a, e, _ in ins]))
        view.out_v.append(tuple([local.get((a, e), -1) if a else -1 for a, e, _ in outs]))
    else:
        view.in_v.append(_no_vertices(len(ins)))
        view.out_v.append(_no_vertices(len(outs)))
