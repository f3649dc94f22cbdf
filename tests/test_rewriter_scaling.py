"""The rewrite does the same Python work per node at every graph size.

Timings are not asserted in tests (``bench/rewrite_speed.py`` measures them, with the 10x-nodes
goal); the work is, because it can be counted exactly: the bytecodes one rewrite executes and
the C functions it calls. Work per node that rises with the size means an algorithm worse than
linear (a list scanned once per node, a pass repeated per vertex), which a 1M-node graph would
turn into minutes.
"""

from __future__ import annotations

import os
import sys

import pytest
from tensorflow.core.framework import graph_pb2

from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
from _work import count_python_work  # noqa: E402
from rewrite_speed import synthetic_graph  # noqa: E402

pytestmark = pytest.mark.skipif(
    sys.gettrace() is not None or sys.getprofile() is not None,
    reason="counts bytecodes with sys.settrace, which a coverage tool or debugger already holds",
)


def _reversed(graph: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """The same graph with its nodes listed last to first: no input then names the node just
    before its reader, so every edge is resolved through the name index (the general path)."""
    out = graph_pb2.GraphDef()
    out.node.extend(reversed(graph.node))
    return out


def _work_per_node(graph: graph_pb2.GraphDef) -> tuple[float, float]:
    config = RewriteConfig(preserve_nodes=frozenset(["input"]))
    rewrite_graph_def(graph, config)  # one-off caches (op registry, kernels) filled first
    bytecodes, c_calls = count_python_work(lambda: rewrite_graph_def(graph, config))
    return bytecodes / len(graph.node), c_calls / len(graph.node)


@pytest.mark.parametrize("order", ["as built", "reversed"])
def test_work_per_node_does_not_grow_with_the_graph(order: str) -> None:
    small, large = synthetic_graph(1_000), synthetic_graph(10_000)
    if order == "reversed":
        small, large = _reversed(small), _reversed(large)
    small_bytecodes, small_calls = _work_per_node(small)
    large_bytecodes, large_calls = _work_per_node(large)
    # Fixed costs (logging, config) spread over more nodes make the large graph's figures a
    # little smaller; 1% more per node would be 10 bytecodes per node of extra work.
    assert large_bytecodes <= 1.01 * small_bytecodes, (small_bytecodes, large_bytecodes)
    assert large_calls <= 1.01 * small_calls, (small_calls, large_calls)
    # The count is real work, not an idle tracer: a rewrite runs hundreds per node.
    assert small_bytecodes > 100
