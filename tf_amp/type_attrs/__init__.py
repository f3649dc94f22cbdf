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

Modules: ``op_info`` (what an OpDef says about an op's ports), ``exclude`` (the node attr that
keeps a node float32), ``body_view`` (the ``BodyView`` columns), ``vertices`` (float32 vertices
per node), ``edges`` (input strings resolved to edges), ``build`` (``build_body_view``, which
runs them in order). This package imports nothing else of tf_amp: it is the first stage of the
rewrite (type_attrs -> painter -> cast_planner -> report -> rewriter).
"""

from __future__ import annotations

from tf_amp.type_attrs.body_view import (
    ARG_OP,
    RETVAL_OP,
    BodyView,
    GraphRewriteError,
    NodeColumns,
    device_type,
    read_node_columns,
)
from tf_amp.type_attrs.build import build_body_view
from tf_amp.type_attrs.exclude import (
    EXCLUDE_ATTR,
    EXCLUDE_NONE,
    EXCLUDE_NOT_READ,
    EXCLUDE_USER,
    EXCLUDE_VIEW,
    FLOAT32_VIEW,
    exclude_mark,
)
from tf_amp.type_attrs.op_info import (
    DT_BFLOAT16,
    DT_FLOAT,
    DT_FLOAT_REF,
    DT_HALF,
    DT_RESOURCE,
    DT_VARIANT,
    UNKNOWN_DTYPE,
    ArgInfo,
    OpInfo,
    Port,
    function_op_info,
    registry_op_info,
)

__all__ = [
    "ARG_OP",
    "DT_BFLOAT16",
    "DT_FLOAT",
    "DT_FLOAT_REF",
    "DT_HALF",
    "DT_RESOURCE",
    "DT_VARIANT",
    "EXCLUDE_ATTR",
    "EXCLUDE_NONE",
    "EXCLUDE_NOT_READ",
    "EXCLUDE_USER",
    "EXCLUDE_VIEW",
    "FLOAT32_VIEW",
    "RETVAL_OP",
    "UNKNOWN_DTYPE",
    "ArgInfo",
    "BodyView",
    "GraphRewriteError",
    "NodeColumns",
    "OpInfo",
    "Port",
    "build_body_view",
    "device_type",
    "exclude_mark",
    "function_op_info",
    "read_node_columns",
    "registry_op_info",
]
