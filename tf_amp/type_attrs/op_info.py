"""What the OpDef registry says about an op type's ports, reduced to what the vertex view needs.

An ``OpInfo`` is computed once per op type (or per library function called as an op) and then
shared by every node of that type: which attrs are ``type`` / ``list(type)`` attrs, which dtypes
they allow, and which attr governs each input and output port. Most ops have a *static* layout
(no ``N``-counted or typed-list args), so the per-node work is a tuple lookup; the others are
laid out per node from the node's attrs (``node_layout``, ``out_arg_offsets``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


def attr_value(proto: Any, info: OpInfo | None, attr: str) -> Any:
    """The node's value of ``attr``, else the OpDef's default (None when neither exists)."""
    attrs = proto.attr
    if attr in attrs:
        return attrs[attr]
    if info is not None:
        return info.defaults.get(attr)
    return None


def node_layout(args: Sequence[ArgInfo], proto: Any, info: OpInfo) -> tuple[Port, ...]:
    """One port descriptor per flat input or output port of this node: ``N``-counted and
    typed-list args expand to as many ports as the node's attrs say."""
    ports: list[Port] = []
    for arg in args:
        if arg.type_list_attr:
            value = attr_value(proto, info, arg.type_list_attr)
            count = len(value.list.type) if value is not None else 0
            ports.extend((arg.type_list_attr, i, 0) for i in range(count))
            continue
        count = 1
        if arg.number_attr:
            value = attr_value(proto, info, arg.number_attr)
            count = int(value.i) if value is not None else 0
        port: Port = (arg.type_attr, -1, 0) if arg.type_attr else ("", -1, arg.fixed_type)
        ports.extend([port] * count)
    return tuple(ports)


def out_arg_offsets(info: OpInfo, proto: Any) -> dict[str, int]:
    """{output arg name: its first flat output port} for this node: what resolves a
    FunctionDef input ``node:out_arg:i`` to a port."""
    if info.out_arg_offsets_static is not None:
        return info.out_arg_offsets_static
    offsets: dict[str, int] = {}
    pos = 0
    for arg in info.out_args:
        offsets[arg.name] = pos
        if arg.type_list_attr:
            value = attr_value(proto, info, arg.type_list_attr)
            pos += len(value.list.type) if value is not None else 0
        elif arg.number_attr:
            value = attr_value(proto, info, arg.number_attr)
            pos += int(value.i) if value is not None else 0
        else:
            pos += 1
    return offsets


def function_attr_names(node: Any) -> list[str]:
    """Names of the functions a NodeDef names in its attributes: a call's ``f``, a
    ``While``'s ``cond`` and ``body``, ``If``'s branches, ``Case``'s list of them."""
    names = []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names
