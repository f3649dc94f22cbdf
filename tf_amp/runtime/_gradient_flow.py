"""Where a custom loop's gradients go, read from the graph being traced.

The environment's custom-loop loss scaling (:mod:`tf_amp.runtime.auto_loss_scale`) scales a
``tape.gradient`` call only when a Keras ``apply`` takes its gradients and nothing else writes
state with them: only an apply can skip a step that overflowed. These helpers answer the two
questions from the graph:

* :func:`sources_of`: which tensors (of the graphs being built) and which finished function
  graphs (a loop body, a ``tf.cond`` branch, a nested ``tf.function``) the tensors given to an
  ``apply`` are computed from, along data inputs;
* :func:`writes_state`: whether a gradient already feeds a state update (a hand-written
  ``assign_sub``, SAM's perturbation of the weights) before the apply is built.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp.type_attrs.op_info import function_attr_names

# Ops that write a variable's value (resource or TF1 ref variables), and the optimizers' fused
# updates: a gradient reaching one has changed state with no step to skip. Named one by one
# where a prefix would also take pure ops (``ScatterNd``, ``TensorScatterUpdate``).
_WRITE_PREFIXES = ("Assign", "ResourceApply", "ResourceSparseApply", "ResourceScatter",
                   "Apply", "SparseApply")
_WRITES = frozenset({
    "ResourceStridedSliceAssign", "StridedSliceAssign",
    "ScatterAdd", "ScatterSub", "ScatterMul", "ScatterDiv", "ScatterMin", "ScatterMax",
    "ScatterUpdate", "ScatterNdAdd", "ScatterNdSub", "ScatterNdUpdate", "ScatterNdMax",
    "ScatterNdMin",
})


def key_of(tensor: Any) -> tuple[int, str, int]:
    """A graph tensor's identity (its Python object may be made again on each ``op.inputs``)."""
    return id(tensor.graph), tensor.op.name, tensor.value_index


def symbolic(value: Any) -> bool:
    return isinstance(value, tf.Tensor) and tf.is_symbolic_tensor(value)


def sources_of(
    tensors: Iterable[Any], wanted: set[tuple[int, str, int]]
) -> tuple[set[tuple[int, str, int]], list[Any]]:
    """Walks back from ``tensors`` along data inputs (not control inputs: a read ordered after
    a weight update is not computed from the update's values), across the captures of function
    graphs, stopping at the tensors in ``wanted``.

    Returns the keys of ``wanted`` reached, and the function graphs of the ops passed (loop
    bodies, branches, nested functions) with the graphs nested in them: their outputs feed
    ``tensors``, so gradient calls inside them may too."""
    reached: set[tuple[int, str, int]] = set()
    inner: dict[int, Any] = {}
    external_of: dict[Any, dict[Any, Any]] = {}
    stack = [t for t in tensors if symbolic(t)]
    seen: set[tuple[int, str, int]] = set()
    while stack:
        tensor = stack.pop()
        key = key_of(tensor)
        if key in seen:
            continue
        seen.add(key)
        if key in wanted:
            reached.add(key)
            continue
        external = _captured_from(tensor, external_of)
        if external is not None:
            if symbolic(external):
                stack.append(external)
            continue
        for graph in _function_graphs_of(tensor.op):
            _add_nested(graph, inner)
        stack.extend(tensor.op.inputs)
    return reached, list(inner.values())


def writes_state(tensors: Iterable[Any]) -> bool:
    """Whether an op downstream of ``tensors`` (along data edges, in their graphs) writes a
    variable, itself or in a function it runs."""
    stack = [t for t in tensors if symbolic(t)]
    seen: set[str] = set()
    while stack:
        for op in stack.pop().consumers():
            if op.name in seen:
                continue
            seen.add(op.name)
            if _writes(op):
                return True
            stack.extend(op.outputs)
    return False


def _is_a_write(op: Any) -> bool:
    return op.type in _WRITES or op.type.startswith(_WRITE_PREFIXES)


def _writes(op: Any) -> bool:
    if _is_a_write(op):
        return True
    nested: dict[int, Any] = {}
    for graph in _function_graphs_of(op):
        _add_nested(graph, nested)
    return any(
        _is_a_write(inner)
        for graph in nested.values()
        for inner in graph.get_operations()
    )


def _captured_from(tensor: Any, external_of: dict[Any, dict[Any, Any]]) -> Any:
    """The outer tensor that ``tensor``, a function graph's placeholder, captures; else None."""
    if tensor.op.type != "Placeholder":
        return None
    graph = tensor.graph
    if graph not in external_of:
        external_of[graph] = {
            key_of(internal): external
            for external, internal in getattr(graph, "captures", ())
            if symbolic(internal)
        }
    return external_of[graph].get(key_of(tensor))


def _function_graphs_of(op: Any) -> list[Any]:
    """The graphs of the functions ``op`` runs (``While`` body and cond, ``If`` branches, a
    call's function), as far as its graph's function table has them."""
    graphs = []
    for name in function_attr_names(op.node_def):
        graph = upstream_tf.function_graph(op.graph, name)
        if graph is not None:
            graphs.append(graph)
    return graphs


def _add_nested(graph: Any, found: dict[int, Any]) -> None:
    """``graph`` and every function graph run by an op in it, at any depth, into ``found``."""
    if id(graph) in found:
        return
    found[id(graph)] = graph
    for op in graph.get_operations():
        for inner in _function_graphs_of(op):
            _add_nested(inner, found)
