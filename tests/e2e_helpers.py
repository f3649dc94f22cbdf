"""Shared helpers for the end-to-end tests: evidence that float16 kernels really ran."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tensorflow.core.framework import graph_pb2, types_pb2

HEAVY_OPS = frozenset({"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "MatMul"})


def half_ops(graph_def: graph_pb2.GraphDef) -> set[str]:
    """Op types whose ``T`` is float16 in the main graph and every library function."""
    nodes: list[Any] = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return {n.op for n in nodes if n.attr["T"].type == types_pb2.DT_HALF}


def half_ops_of_functions(concretes: Iterable[Any]) -> set[str]:
    """``half_ops`` over the graphs of (rewritten) concrete functions."""
    found: set[str] = set()
    for concrete in concretes:
        found |= half_ops(concrete.graph.as_graph_def())
    return found


def executed_half_ops(run_metadata: Any) -> set[str]:
    """Op types with a float16 ``T`` in the partition graphs a TF1 Session actually executed."""
    found: set[str] = set()
    for graph in run_metadata.partition_graphs:
        found |= {n.op for n in graph.node if n.attr["T"].type == types_pb2.DT_HALF}
    return found


def module_with_an_xla_step(
    optimizer: Any, variable: Any, apply: Callable[[Any, Any, Any], None]
) -> Any:
    """A ``tf.Module`` holding ``variable`` and ``optimizer``, whose ``train(gradient)`` (one
    float of gradient, compiled with XLA) calls ``apply(optimizer, gradient, variable)`` and
    returns the variable: a custom training step as users export them."""
    import tensorflow as tf

    class Trainer(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.variable, self.optimizer = variable, optimizer

        @tf.function(jit_compile=True, input_signature=[tf.TensorSpec([1])])
        def train(self, gradient: tf.Tensor) -> tf.Tensor:
            apply(self.optimizer, gradient, self.variable)
            return self.variable.read_value()

    return Trainer()
