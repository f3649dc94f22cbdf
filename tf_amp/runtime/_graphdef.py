"""GraphDef plumbing shared by the runtime adapters: inline, rewrite, rename library functions.

Why these steps (see also the runtime section of docs/ARCHITECTURE.md): a traced ``tf.function``
keeps its callees in a function library; the rewriter can only paint across a call boundary once
the callee's body is in the main graph, so Grappler's function optimizer inlines them first (it
also lowers If/While to Switch/Merge). Functions that stay in the library (``jit_compile``
callees are never inlined) are rewritten too, and every library function gets a new unique name,
because TensorFlow refuses to register a changed function under a name it already knows
("duplicate function ... definitions differ").
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tensorflow.core.framework import attr_value_pb2, graph_pb2
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2

from tf_amp._upstream.tensorflow import tf_optimizer
from tf_amp.type_attrs.exclude import CALL_OPS, called_functions

_LOG = logging.getLogger("tf_amp")
_UID = itertools.count()
# The name of the graph being rewritten, for log lines: set around a RewriteFn call, because a
# RewriteFn takes (graph_def, keep) only and callers may pass their own.
_GRAPH_NAME: contextvars.ContextVar[str] = contextvars.ContextVar("tf_amp_graph_name", default="")


@contextlib.contextmanager
def naming_graph(name: str) -> Iterator[None]:
    """Within this block, the default rewrite names its graph ``name`` in its log lines."""
    token = _GRAPH_NAME.set(name)
    try:
        yield
    finally:
        _GRAPH_NAME.reset(token)

# (graph_def, names of nodes whose dtypes must not change) -> rewritten graph_def
RewriteFn = Callable[[graph_pb2.GraphDef, frozenset], graph_pb2.GraphDef]




def has_function_calls(graph_def: graph_pb2.GraphDef) -> bool:
    """True when the main graph calls a library function (a nested ``tf.function``).

    Functional control flow (If / While / Case) does not count: its branch and body functions
    are rewritten in the library like any other function, so inlining them buys little, and
    skipping Grappler when nothing else needs inlining saves a large part of the rebuild time.
    """
    names = {f.signature.name for f in graph_def.library.function}
    return any(node.op in CALL_OPS or node.op in names for node in graph_def.node)


def grappler_request(
    graph_def: graph_pb2.GraphDef, keep: Iterable[str], optimizers: Iterable[str]
) -> tuple[config_pb2.ConfigProto, meta_graph_pb2.MetaGraphDef]:
    """The arguments of one ``tf_optimizer.OptimizeGraph`` call running only ``optimizers``,
    once, on any graph size, with the ``keep`` nodes preserved (as a session's fetches are).

    Returned rather than run, so a caller can time the Grappler call alone (``_oracle``).
    """
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    meta.collection_def["train_op"].node_list.value.extend(sorted(set(keep)))
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.extend(optimizers)
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    return config, meta


def inline_library(graph_def: graph_pb2.GraphDef, keep: Iterable[str]) -> graph_pb2.GraphDef:
    """Inlines function calls with Grappler's function optimizer and nothing else.

    ``keep`` names the nodes that must survive (fetches and side-effecting ops); Grappler would
    otherwise be free to drop or rename them. A graph without function calls is returned as is.
    """
    if not has_function_calls(graph_def):
        return graph_def
    config, meta = grappler_request(graph_def, keep, ["function"])
    return tf_optimizer.OptimizeGraph(config, meta, verbose=False)


def rename_library_functions(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """Returns a copy whose library functions (and every reference to them) have fresh names."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    names = [f.signature.name for f in out.library.function]
    if not names:
        return out
    uid = next(_UID)
    mapping = {name: f"{name}_tfamp{uid}" for name in names}
    for node in out.node:
        _rename_in_node(node, mapping)
    for function in out.library.function:
        function.signature.name = mapping[function.signature.name]
        for node in function.node_def:
            _rename_in_node(node, mapping)
        for attr in function.attr.values():
            _rename_in_attr(attr, mapping)
    for gradient in out.library.gradient:
        gradient.function_name = mapping.get(gradient.function_name, gradient.function_name)
        gradient.gradient_func = mapping.get(gradient.gradient_func, gradient.gradient_func)
    for registered in out.library.registered_gradients:
        registered.gradient_func = mapping.get(registered.gradient_func, registered.gradient_func)
    return out


def drop_uncalled_functions(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """Returns ``graph_def`` without the library functions that nothing in it calls.

    Why: a traced step's library keeps functions the graph no longer calls, such as the forward
    ``While`` body that the loop's gradient replaced by a ``<body>_rewritten`` copy, and
    bodies that inlining made redundant. Rewriting them costs time, and the "Converted X/Y"
    line counted their nodes: twice the real count on an LSTM step, and conversions in a step
    kept float32 throughout. The rebuilt function is called only through its main graph, so
    what it does not reach never runs (a SavedModel, whose functions are called from outside
    its main graph, never comes here). Gradient functions of kept functions are kept.
    """
    functions = {f.signature.name: f for f in graph_def.library.function}
    if not functions:
        return graph_def
    gradient_of = {g.function_name: g.gradient_func for g in graph_def.library.gradient}
    reached: set[str] = set()
    pending = [name for node in graph_def.node for name in called_functions(node, functions)]
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        reached.add(name)
        pending.extend(
            c for node in functions[name].node_def for c in called_functions(node, functions)
        )
        if gradient_of.get(name) in functions:
            pending.append(gradient_of[name])
    if len(reached) == len(functions):
        return graph_def
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.library.function[:]
    out.library.function.extend(f for f in graph_def.library.function
                                if f.signature.name in reached)
    del out.library.gradient[:]
    out.library.gradient.extend(g for g in graph_def.library.gradient
                                if g.function_name in reached)
    return out


def _rename_in_node(node, mapping: dict[str, str]) -> None:
    if node.op in mapping:
        node.op = mapping[node.op]
    for attr in node.attr.values():
        _rename_in_attr(attr, mapping)


def _rename_in_attr(attr: attr_value_pb2.AttrValue, mapping: dict[str, str]) -> None:
    if attr.HasField("func"):
        _rename_func(attr.func, mapping)
    elif attr.HasField("list"):
        for func in attr.list.func:
            _rename_func(func, mapping)


def _rename_func(func: attr_value_pb2.NameAttrList, mapping: dict[str, str]) -> None:
    if func.name in mapping:
        func.name = mapping[func.name]
    for attr in func.attr.values():
        _rename_in_attr(attr, mapping)


def inputs_as_placeholders(
    graph_def: graph_pb2.GraphDef, names: Iterable[str]
) -> graph_pb2.GraphDef:
    """Returns a copy in which the named ``Const`` nodes are ``Placeholder`` nodes.

    ``tf.function`` captures a small eager tensor as a ``Const`` node that is nonetheless one of
    the graph's inputs, fed with the captured value on every call. The rebuilt function feeds
    every input through its own placeholder, so the rewrite must see the capture as an input of
    fixed dtype: left a ``Const``, it may be folded to float16 while the fed value stays float32.
    """
    wanted = set(names)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.name not in wanted or node.op != "Const":
            continue
        shape = node.attr["value"].tensor.tensor_shape
        node.op = "Placeholder"
        del node.attr["value"]
        node.attr["shape"].shape.CopyFrom(shape)
    return out


def strip_nodes(graph_def: graph_pb2.GraphDef, names: Iterable[str]) -> graph_pb2.GraphDef:
    """Removes the named nodes and any ``loc:@`` colocation with them.

    The capture and argument placeholders of a traced function are replaced by inputs of the
    rebuilt one; leaving them in would import dead placeholders whose colocation constraints
    point at nodes that no longer exist.
    """
    drop = set(names)
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    stale = {f"loc:@{name}".encode() for name in drop}
    for node in graph_def.node:
        if node.name in drop:
            continue
        new = out.node.add()
        new.CopyFrom(node)
        if "_class" in new.attr:
            kept = [c for c in new.attr["_class"].list.s if c not in stale]
            if kept:
                del new.attr["_class"].list.s[:]
                new.attr["_class"].list.s.extend(kept)
            else:
                del new.attr["_class"]
    return out


def default_rewrite(config=None, reports: list | None = None, **forced: Any) -> RewriteFn:
    """The real rewriter as a RewriteFn (imported lazily: it is heavy).

    ``config`` defaults to ``RewriteConfig.from_env()``, read when a graph is rewritten; the
    fetched nodes are added to its ``preserve_nodes`` so outputs keep their dtypes, and the
    ``forced`` fields (``preserve_names=True`` for the Session) override it. Each rewrite's
    report is appended to ``reports`` when given.
    """

    def rewrite(graph_def: graph_pb2.GraphDef, keep: frozenset) -> graph_pb2.GraphDef:
        from tf_amp.config import RewriteConfig
        from tf_amp.rewriter import rewrite_graph_def

        base = config if config is not None else RewriteConfig.from_env()
        effective = base.replace(
            preserve_nodes=frozenset(base.preserve_nodes) | set(keep), **forced
        )
        # A graph TensorFlow built (traced, or a Session's), so no cycle to look for.
        result = rewrite_graph_def(
            graph_def, effective, graph_name=_GRAPH_NAME.get(), built_by_tensorflow=True
        )
        if reports is not None:
            reports.append(result.report)
        return result.graph_def

    return rewrite
