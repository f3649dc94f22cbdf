"""Rebuild a traced ``tf.function`` graph from its rewritten GraphDef, bound to its variables.

Why this way: TensorFlow 2 cannot run a Python Grappler pass, so for each input signature
``tf.function`` traces, the traced graph is taken as a GraphDef, its function library inlined
(:mod:`tf_amp.runtime._graphdef`), the main graph and every remaining library function
rewritten, the library functions given fresh names, and the result imported once into a new
``FuncGraph`` whose capture placeholders are bound to the *original* variable handles
(``FuncGraph.capture``). Variables, optimizer slots, BatchNorm statistics and metrics therefore
update in place, exactly as with the float32 function. Importing directly costs about 0.1 s;
going through ``prune`` costs about 1 s.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tf_amp import ops as native_ops
from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp.runtime import _graphdef
from tf_amp.type_attrs.exclude import (
    excluded_node_names,
    mark_callees_of_excluded_calls,
    mark_nodes_made_from,
)

_LOG = logging.getLogger("tf_amp")
_XLA_MUST_COMPILE = "_XlaMustCompile"


def rebuild_concrete_function(
    original: Any,
    rewrite: _graphdef.RewriteFn,
    jit_compile: bool | None = None,
    add_shapes: bool = False,
    exclude_scopes: tuple[str, ...] = (),
) -> Any:
    """Returns a ConcreteFunction running ``rewrite`` of ``original``'s graph on its variables.

    ``original`` is a traced ``ConcreteFunction``; the result has the same calling convention
    (function type, structured outputs) and the same captures, so it can be called with the same
    arguments and updates the same variables. ``add_shapes`` writes each node's output shapes
    into the GraphDef (``_output_shapes``): the probe needs the shapes of variable reads, which
    a GraphDef otherwise loses.
    """
    graph = original.graph
    captures = list(graph.captures)  # by value: (external value, internal placeholder)
    # By-reference captures (evaluated at call time, e.g. under tf.distribute): key -> nest of
    # placeholders, fed from a closure the ConcreteFunction calls on every call.
    by_ref = graph._function_captures  # noqa: SLF001
    ref_keys = list(by_ref.by_ref_internal)
    capture_ids = {id(internal) for _, internal in captures}
    for key in ref_keys:
        capture_ids |= {id(t) for t in tf.nest.flatten(by_ref.by_ref_internal[key])}
    arg_inputs = [t for t in graph.inputs if id(t) not in capture_ids]
    output_tensors = [t for t in graph.outputs if t is not None]
    control_ops = [op for op in graph.control_outputs]

    fetched = {t.op.name for t in output_tensors}
    keep = fetched | {op.name for op in control_ops} | {t.op.name for t in graph.inputs}
    placeholder_names = [t.op.name for t in graph.inputs]
    graph_def = _graphdef.inputs_as_placeholders(
        graph.as_graph_def(add_shapes=add_shapes), placeholder_names
    )
    # Before inlining drops the call's mark (and its scope: the inlined backward is not in it).
    mark_callees_of_excluded_calls(graph_def, exclude_scopes)
    excluded = excluded_node_names(graph_def, exclude_scopes)
    graph_def = _graphdef.inline_library(graph_def, keep)
    mark_nodes_made_from(graph_def, excluded)  # what inlining and lowering made of them
    graph_def = _graphdef.drop_uncalled_functions(graph_def)
    with _graphdef.naming_graph(graph.name):
        graph_def = rewrite(graph_def, frozenset(fetched))
    graph_def = _graphdef.strip_nodes(graph_def, placeholder_names)
    graph_def = _graphdef.rename_library_functions(graph_def)

    new_graph = upstream_tf.FuncGraph(f"tf_amp_{graph.name}")
    replaced: dict[int, tf.Tensor] = {}  # id(old input placeholder) -> new one
    with new_graph.as_default():
        for old in arg_inputs:
            replaced[id(old)] = _placeholder_like(old)
        for external, internal in captures:
            placeholder = new_graph.capture(external, name=internal.op.name)
            _copy_handle_data(internal, placeholder)
            replaced[id(internal)] = placeholder
        for key in ref_keys:
            old_nest = by_ref.by_ref_internal[key]
            new_nest = tf.nest.map_structure(_placeholder_like, old_nest)
            for old, new in zip(tf.nest.flatten(old_nest), tf.nest.flatten(new_nest), strict=True):
                replaced[id(old)] = new
            new_graph._function_captures.add_or_replace(  # noqa: SLF001
                key=key,
                external=by_ref.by_ref_external[key],
                internal=new_nest,
                tracetype=by_ref._by_ref_tracetype[key],  # noqa: SLF001
                is_by_ref=True,
            )
        input_map = {t.name: replaced[id(t)] for t in graph.inputs}
        imported = _import(graph_def, input_map, output_tensors, control_ops)
        # The runtime resolves calls to library functions by name in the eager context;
        # functions imported through a GraphDef are not registered there by themselves.
        upstream_tf.hold_library_functions(new_graph, list(graph_def.library.function))
    _carry_creation_stacks(graph, new_graph)
    tensor_map = dict(zip((t.name for t in output_tensors), imported[0], strict=False))
    tensor_map.update(input_map)

    def remap(value: Any) -> Any:
        if isinstance(value, tf.Tensor) and tf.is_symbolic_tensor(value):
            return tensor_map[value.name]
        return value

    new_graph.inputs = [replaced[id(t)] for t in graph.inputs]  # same order as the original
    new_graph.structured_input_signature = graph.structured_input_signature
    new_graph.structured_outputs = tf.nest.map_structure(
        remap, graph.structured_outputs, expand_composites=True
    )
    new_graph.outputs = [tensor_map[t.name] for t in output_tensors]
    new_graph.control_outputs = list(imported[1])
    new_graph.variables = graph.variables

    # The user's attributes (experimental_attributes, experimental_implements) go with the
    # function; whether XLA must compile it is decided again below, for the rewritten graph.
    attrs = {
        name: value
        for name, value in upstream_tf.function_attributes(original).items()
        if name not in _NOT_CARRIED_ATTRS
    }
    if jit_compile:
        blocking = _ops_without_xla_kernel(graph_def)
        if blocking:
            _LOG.warning(
                "%s has op(s) without an XLA kernel (%s); running the rewritten "
                "function without jit_compile instead of failing to compile it.",
                graph.name,
                ", ".join(sorted(blocking)),
            )
        else:
            attrs[_XLA_MUST_COMPILE] = True
    elif jit_compile is False:
        attrs[_XLA_MUST_COMPILE] = False  # the user's "never compile", as tf.function marks it
    rebuilt = upstream_tf.ConcreteFunction.from_func_graph(
        new_graph, original.function_type, attrs=attrs
    )
    # The flat calling convention (positional / keyword argument names) is set by tf.function
    # after tracing; copy it so flat calls behave the same.
    rebuilt._arg_keywords = original._arg_keywords  # noqa: SLF001
    rebuilt._num_positional_args = original._num_positional_args  # noqa: SLF001
    return rebuilt


# Not carried to the rebuild: XLA is decided for the rewritten graph; the gradient function
# names belong to the original's graph.
_NOT_CARRIED_ATTRS = frozenset({_XLA_MUST_COMPILE, "forward_function_name",
                                "backward_function_name"})


def _ops_without_xla_kernel(graph_def: graph_pb2.GraphDef) -> set[str]:
    """Op types in ``graph_def`` (library included) that XLA cannot compile: custom ops
    known to have CPU/GPU kernels but no XLA kernel. (Read here, not when this module loads:
    under the environment, ``import tf_amp.ops`` loads TensorFlow, whose activation loads
    this module while ``tf_amp.ops`` is still half made.)"""
    no_xla_ops = {native_ops.NATIVE_OP_NAME}
    nodes = list(graph_def.node)
    for fdef in graph_def.library.function:
        nodes.extend(fdef.node_def)
    return {n.op for n in nodes if n.op in no_xla_ops}


def _placeholder_like(old: tf.Tensor) -> tf.Tensor:
    new = tf.raw_ops.Placeholder(dtype=old.dtype, shape=old.shape, name=old.op.name)
    _copy_handle_data(old, new)
    return new


def _copy_handle_data(source: tf.Tensor, target: tf.Tensor) -> None:
    """Resource placeholders carry the variable's dtype/shape as handle data; keep it."""
    if source.dtype in (tf.resource, tf.variant):
        upstream_tf.copy_handle_data(source, target)


# Ops that raise no error at run time: no stack to carry (three pybind calls an op, 20-28 us).
_CANNOT_FAIL = frozenset({"Const", "NoOp", "Identity", "Placeholder"})


def _carry_creation_stacks(traced: Any, rebuilt: Any) -> None:
    """Each rebuilt op gets the Python stack of the traced op it stands for, so a runtime error
    ("Detected at node ... defined at") points at the user's line, as with ``tf.function``.

    An op keeps its name through the rewrite; one inlined from a function call is named
    ``<call>/<node>`` and gets the call's stack; a Cast the rewrite added gets the stack of the
    nearest traced name above its own. Ops inside a control-flow body (a library function)
    still have none: the runtime takes a function's stacks only from a graph it converts.
    """
    traced_ops = {op.name: op for op in traced.get_operations()}
    for op in rebuilt.get_operations():
        if op.type in _CANNOT_FAIL:
            continue
        name = op.name
        source = traced_ops.get(name)
        while source is None and "/" in name:
            name = name.rsplit("/", 1)[0]
            source = traced_ops.get(name)
        if source is not None:
            upstream_tf.copy_creation_stack(op, source)


def _import(
    graph_def: graph_pb2.GraphDef,
    input_map: dict[str, tf.Tensor],
    outputs: list[tf.Tensor],
    control_ops: list[Any],
) -> tuple[list[tf.Tensor], list[Any]]:
    """Imports ``graph_def`` into the default graph; returns the remapped outputs / control ops."""
    mapped = set(input_map)
    fetch_names = [t.name for t in outputs if t.name not in mapped]
    control_names = [op.name for op in control_ops]
    # The importer rejects input_map keys no node reads: an argument the body never uses
    # (a flag, a mask, a step counter) has no reader once its placeholder is stripped.
    # A control input on an argument (``^name``) needs a key of its own, or it names a node
    # that is gone.
    read: set[str] = set()
    for node in graph_def.node:
        for text in node.input:
            if text.startswith("^"):
                read.add(text)
            else:
                read.add(text if ":" in text else text + ":0")
    argument_map = {name: tensor for name, tensor in input_map.items() if name in read}
    for name, tensor in input_map.items():
        control = "^" + name.rsplit(":", 1)[0]
        if name.endswith(":0") and control in read:
            argument_map[control] = tensor
    elements = tf.graph_util.import_graph_def(
        graph_def,
        input_map=argument_map,
        return_elements=fetch_names + control_names,
        name="",
    )
    fetched = dict(zip(fetch_names, elements[: len(fetch_names)], strict=False))
    new_outputs = [input_map[t.name] if t.name in mapped else fetched[t.name] for t in outputs]
    return new_outputs, list(elements[len(fetch_names) :])
