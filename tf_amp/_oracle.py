"""TensorFlow's own auto-mixed-precision pass, as a reference for tests and benchmarks.

Not used by the rewrite. ``run_tf_pass`` runs Grappler with only ``auto_mixed_precision_cpu``
and ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16=0``; on a CPU-only machine that makes
the same painting decisions as the real GPU pass (emulation on would insert extra casts, is
quadratic, and crashes on v1 loops). ``compare`` lines up per-vertex colours of two rewrites.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from tensorflow.core.framework import graph_pb2, types_pb2

_FLOAT = types_pb2.DT_FLOAT
_HALF = types_pb2.DT_HALF


def run_tf_pass(
    graph_def: graph_pb2.GraphDef, fetches: Iterable[str] = ()
) -> tuple[graph_pb2.GraphDef, float]:
    """(rewritten graph, process CPU seconds spent in Grappler's OptimizeGraph call).
    ``fetches`` are preserved, as a session's fetches would be."""
    from tensorflow.python.grappler import tf_optimizer

    from tf_amp.runtime._graphdef import grappler_request

    os.environ["TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16"] = "0"
    cfg, meta = grappler_request(graph_def, fetches, ["auto_mixed_precision_cpu"])
    start = time.process_time()
    out = tf_optimizer.OptimizeGraph(cfg, meta)
    return out, time.process_time() - start


def _float_attrs(node: object) -> dict[str, int]:
    """{attr or attr[i]: dtype} for every type / list(type) attr of a NodeDef."""
    result: dict[str, int] = {}
    for name, value in node.attr.items():  # type: ignore[attr-defined]
        kind = value.WhichOneof("value")
        if kind == "type":
            result[name] = value.type
        elif kind == "list" and value.list.type:
            for i, t in enumerate(value.list.type):
                result[f"{name}[{i}]"] = t
    return result


def vertex_dtypes(graph_def: graph_pb2.GraphDef) -> dict[tuple[str, str, str], int]:
    """{(body, node, attr): dtype} over the main graph and every library function."""
    out: dict[tuple[str, str, str], int] = {}
    for node in graph_def.node:
        for attr, t in _float_attrs(node).items():
            out[("", node.name, attr)] = t
    for fdef in graph_def.library.function:
        for node in fdef.node_def:
            for attr, t in _float_attrs(node).items():
                out[(fdef.signature.name, node.name, attr)] = t
    return out


def count_new_casts(
    before: graph_pb2.GraphDef, after: graph_pb2.GraphDef
) -> dict[str, int]:
    """Casts present in ``after`` but not ``before``, by direction, over all bodies."""
    def casts(gd: graph_pb2.GraphDef) -> dict[tuple[str, str], tuple[int, int]]:
        found = {}
        bodies = [("", gd.node)] + [(f.signature.name, f.node_def) for f in gd.library.function]
        for body, nodes in bodies:
            for n in nodes:
                if n.op == "Cast":
                    found[(body, n.name)] = (n.attr["SrcT"].type, n.attr["DstT"].type)
        return found

    old = casts(before)
    counts = {"to_half": 0, "to_float": 0}
    for key, (src, dst) in casts(after).items():
        if key in old:
            continue
        if dst in (_HALF, types_pb2.DT_BFLOAT16):
            counts["to_half"] += 1
        elif src in (_HALF, types_pb2.DT_BFLOAT16):
            counts["to_float"] += 1
    return counts


@dataclass
class Comparison:
    """Per-vertex agreement between our rewrite and TensorFlow's."""

    vertices: int = 0
    agree: int = 0
    only_ours_half: list[tuple[str, str, str]] = field(default_factory=list)
    only_tf_half: list[tuple[str, str, str]] = field(default_factory=list)
    ours_casts: dict[str, int] = field(default_factory=dict)
    tf_casts: dict[str, int] = field(default_factory=dict)

    @property
    def differing(self) -> int:
        return len(self.only_ours_half) + len(self.only_tf_half)


def compare(
    before: graph_pb2.GraphDef, ours: graph_pb2.GraphDef, theirs: graph_pb2.GraphDef
) -> Comparison:
    """Compare float32 vertices of ``before`` as painted by us and by TensorFlow. Bodies that
    TensorFlow did not keep (functions it inlined or pruned) are skipped."""
    base = vertex_dtypes(before)
    mine = vertex_dtypes(ours)
    tf_side = vertex_dtypes(theirs)
    result = Comparison()
    for key, dtype in base.items():
        if dtype != _FLOAT or key not in tf_side:
            continue
        result.vertices += 1
        a = mine.get(key, _FLOAT) != _FLOAT
        b = tf_side[key] != _FLOAT
        if a == b:
            result.agree += 1
        elif a:
            result.only_ours_half.append(key)
        else:
            result.only_tf_half.append(key)
    result.ours_casts = count_new_casts(before, ours)
    result.tf_casts = count_new_casts(before, theirs)
    return result
