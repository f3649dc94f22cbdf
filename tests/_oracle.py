"""TensorFlow's own auto-mixed-precision pass, as a reference for tests and benchmarks.

Not used by the rewrite. ``run_tf_pass`` runs Grappler with only ``auto_mixed_precision_cpu``
and ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16=0``, in this process (the CPU wheel).
It is the second opinion: the reference is TensorFlow's real GPU pass, run from the CUDA build
by ``tests/_gpu_oracle.py``, and on every test graph the two decide every vertex and Cast alike
(checked in tests/test_differential_gpu.py). Emulation on would insert extra casts, is
quadratic, and crashes on v1 loops. ``compare`` lines up per-vertex colours of two rewrites;
``classify`` sorts the vertices where they differ into justified reasons.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tensorflow.core.framework import graph_pb2, types_pb2

if TYPE_CHECKING:
    from tf_amp.report import BodyRecord
    from tf_amp.rewriter import RewriteResult

_FLOAT = types_pb2.DT_FLOAT
_HALF = types_pb2.DT_HALF


def run_tf_pass(
    graph_def: graph_pb2.GraphDef, fetches: Iterable[str] = ()
) -> tuple[graph_pb2.GraphDef, float]:
    """(rewritten graph, process CPU seconds spent in Grappler's OptimizeGraph call).
    ``fetches`` are preserved, as a session's fetches would be.

    Grappler reads the emulation switch from the process environment while the pass runs, so
    it is set for the call and then put back as it was: a test that runs this must not change
    what a later test (or a subprocess it starts) sees."""
    from tensorflow.python.grappler import tf_optimizer

    from tf_amp.runtime._graphdef import grappler_request

    cfg, meta = grappler_request(graph_def, fetches, ["auto_mixed_precision_cpu"])
    with _environment(TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16="0"):
        start = time.process_time()
        out = tf_optimizer.OptimizeGraph(cfg, meta)
        seconds = time.process_time() - start
    return out, seconds


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Sets environment variables for the ``with`` block; restores (or removes) them after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


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


def _bodies(gd: graph_pb2.GraphDef) -> list[tuple[str, Iterable]]:
    return [("", gd.node)] + [(f.signature.name, f.node_def) for f in gd.library.function]


def body_names(gd: graph_pb2.GraphDef) -> set[str]:
    """"" (the main graph) and the name of every library function."""
    return {name for name, _ in _bodies(gd)}


def _casts(gd: graph_pb2.GraphDef) -> dict[tuple[str, str], tuple[int, int]]:
    found = {}
    for body, nodes in _bodies(gd):
        for n in nodes:
            if n.op == "Cast":
                found[(body, n.name)] = (n.attr["SrcT"].type, n.attr["DstT"].type)
    return found


def count_new_casts(
    before: graph_pb2.GraphDef,
    after: graph_pb2.GraphDef,
    bodies: set[str] | None = None,
) -> dict[str, int]:
    """Casts present in ``after`` but not ``before``, by direction, over all bodies (or only
    those named in ``bodies``)."""
    old = _casts(before)
    counts = {"to_half": 0, "to_float": 0}
    for key, (src, dst) in _casts(after).items():
        if key in old or (bodies is not None and key[0] not in bodies):
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
    TensorFlow did not keep (functions it inlined or pruned: e.g. a While body that the
    graph only reaches through its ``_rewritten`` copy) are skipped, for vertices and Casts
    alike."""
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
    kept = body_names(theirs)
    result.ours_casts = count_new_casts(before, ours, kept)
    result.tf_casts = count_new_casts(before, theirs, kept)
    return result


# Reasons a vertex may differ from TensorFlow's pass (``classify``'s buckets).
CONST_FOLDED_TO_HALF = "CONST_FOLDED_TO_HALF"
TENSOR_LIST_CROSSES_BOUNDARY = "TENSOR_LIST_CROSSES_BOUNDARY"
TF_HALF_FEEDS_NO_ALLOW = "TF_HALF_FEEDS_NO_ALLOW"
# A node of a normalization's cancelling sum (tf_amp.painter.normalization_guard), kept
# float32 on purpose: the measured departure from TensorFlow's painting.
NORMALIZATION_GUARD = "NORMALIZATION_GUARD"
# A node that serves only variable updates (tf_amp.painter.update_guard), kept float32 on
# purpose: bfloat16's default, measured faster on a CPU.
UPDATE_GUARD = "UPDATE_GUARD"
# A node of a Keras model's loss or its gradient (tf_amp.painter.loss_guard), kept
# float32 as Keras's policies compute losses.
LOSS_GUARD = "LOSS_GUARD"
# A gather or slice of a float32 weight table (tf_amp.painter.table_selection), kept float32 so
# the Cast is of the rows it selects.
TABLE_SELECTION = "TABLE_SELECTION"
# A loop's running sum (tf_amp.painter.accumulator_guard), kept float32 so each iteration's
# addend is not rounded away.
ACCUMULATOR_GUARD = "ACCUMULATOR_GUARD"
# A reader of a constant beyond the target's range that would scale by it
# (tf_amp.painter.half_range), kept float32.
CONSTANT_RANGE_GUARD = "CONSTANT_RANGE_GUARD"
UNEXPLAINED = "UNEXPLAINED"

REASONS: dict[str, str] = {
    CONST_FOLDED_TO_HALF: (
        "a float32 Const read only by half ops is stored as a half Const instead of feeding "
        "a Cast (RewriteConfig.fold_constant_casts, a measured departure: "
        "bench/rewrite_speed.py --const-fold, GraphDef 49% smaller, same step time); "
        "TensorFlow casts it"
    ),
    TENSOR_LIST_CROSSES_BOUNDARY: (
        "a TensorList whose handle flows into a While/If/function call: TensorFlow paints "
        "the list half in the caller but keeps float32 in the body (a mismatch that fails "
        "when the loop runs); we keep the list float32 on both sides"
    ),
    TF_HALF_FEEDS_NO_ALLOW: (
        "TensorFlow paints it half by its pass 4 (an infer op fed by a half op) and no path "
        "of half vertices leads from it to an allow op: only with the option "
        "RewriteConfig(infer_follows_allow=False)"
    ),
    NORMALIZATION_GUARD: (
        "x * inv or x * inv + (offset - mean * inv) of a normalization: its terms cancel, so "
        "half rounding gives a large error (tf_amp.painter.normalization_guard, a measured "
        "departure: MobileNetV2's first-step loss 0.048 from float32's painted as TensorFlow "
        "paints, 0.037 guarded, 0.032 for Keras's mixed_float16); TensorFlow paints it half"
    ),
    UPDATE_GUARD: (
        "arithmetic that serves only variable updates (an optimizer step, moving statistics): "
        "kept float32 like the state it updates (tf_amp.painter.update_guard, bfloat16's "
        "default: a BERT-like train step 2-4% faster on a CPU with AVX512-BF16, and the "
        "optimizer's moments no longer read through bfloat16); TensorFlow paints it half "
        "by its pass 4 when the gradient comes out of a half op"
    ),
    LOSS_GUARD: (
        "a node of a Keras model's compiled loss or its gradient: kept float32 as Keras's "
        "mixed policies compute losses (tf_amp.painter.loss_guard: 1 - 1e-7, "
        "binary_crossentropy's clip bound, is 1.0 in 16 bits); TensorFlow paints it half"
    ),
    TABLE_SELECTION: (
        "a gather or slice of a float32 weight table that nothing else reads (an embedding "
        "lookup): kept float32 and its output cast, the same bits as casting the table first "
        "(tf_amp.painter.table_selection); TensorFlow paints it half and casts the whole "
        "table every step"
    ),
    ACCUMULATOR_GUARD: (
        "an Add/AddV2/Sub/AddN that updates a loop variable from its own previous value (a "
        "running sum; in a gradient loop, a weight's gradient summed over the iterations): "
        "kept float32 (tf_amp.painter.accumulator_guard), which needs no more Casts, the "
        "loop variable being float32 either way; TensorFlow paints it half by its pass 4"
    ),
    CONSTANT_RANGE_GUARD: (
        "an op that scales by a float32 constant beyond the target's range (h * 1e5, "
        "h / 1e-5): kept float32 (tf_amp.painter.half_range), where half gives inf "
        "(TensorFlow's pass) or a clipped, silently wrong product; TensorFlow paints it half"
    ),
    UNEXPLAINED: "no listed reason",
}


def _vertex_keys(body: BodyRecord) -> dict[tuple[str, str, str], int]:
    view = body.view
    keys = {}
    for v in range(view.num_vertices):
        elem = view.v_elem[v]
        attr = view.v_attr[v] if elem < 0 else f"{view.v_attr[v]}[{elem}]"
        keys[(body.name, view.names[view.v_node[v]], attr)] = v
    return keys


def classify(result: RewriteResult, comparison: Comparison) -> dict[str, list]:
    """Sorts every vertex where our rewrite and TensorFlow's differ into one of ``REASONS``
    (``UNEXPLAINED`` when none applies: a test then fails). Each reason is checked on the
    graph, not assumed: a Const, a TensorList element type that our report says touches a
    boundary, a TF-half vertex from which no TF-half path reaches an allow-list op."""
    from tf_amp.painter import CAT_ALLOW

    tf_half = set(comparison.only_tf_half)
    buckets: dict[str, list] = {reason: [] for reason in REASONS}
    bodies = {body.name: body for body in result.report.bodies}
    key_maps = {name: _vertex_keys(body) for name, body in bodies.items()}
    for key in comparison.only_ours_half:
        body = bodies.get(key[0])
        v = key_maps[key[0]].get(key) if body is not None else None
        if v is not None and body.view.ops[body.view.v_node[v]] == "Const":
            buckets[CONST_FOLDED_TO_HALF].append(key)
        else:
            buckets[UNEXPLAINED].append(("ours-half", key))
    pending: list[tuple[tuple[str, str, str], BodyRecord, int]] = []
    for key in comparison.only_tf_half:
        body = bodies.get(key[0])
        v = key_maps.get(key[0], {}).get(key)
        if body is None or v is None:
            buckets[UNEXPLAINED].append(("tf-half", key))
            continue
        view = body.view
        block = body.painting.node_block[view.v_node[v]]
        if block == "normalization":
            buckets[NORMALIZATION_GUARD].append(key)
            continue
        if block == "variable-update":
            buckets[UPDATE_GUARD].append(key)
            continue
        if block == "table-selection":
            buckets[TABLE_SELECTION].append(key)
            continue
        if block == "compiled-loss":
            buckets[LOSS_GUARD].append(key)
            continue
        if block == "loop-accumulator":
            buckets[ACCUMULATOR_GUARD].append(key)
            continue
        if block == "constant-beyond-range":
            buckets[CONSTANT_RANGE_GUARD].append(key)
            continue
        if view.v_attr[v] == "element_dtype":
            decision = result.report.decision_for(key[1], key[2], key[0])
            if "boundary" in decision.reason or "sharing a handle" in decision.reason:
                buckets[TENSOR_LIST_CROSSES_BOUNDARY].append(key)
                continue
        pending.append((key, body, v))
    _move_clear_neighbours(buckets, pending, key_maps, TENSOR_LIST_CROSSES_BOUNDARY)
    _move_clear_neighbours(buckets, pending, key_maps, ACCUMULATOR_GUARD)
    for key, body, v in pending:
        view = body.view
        # half vertices on TF's side = those both painted + those only TF painted
        colours = body.painting.colour
        tf_side = {u for u in range(view.num_vertices) if colours[u] == 1}
        tf_side |= {key_maps[key[0]][k] for k in tf_half if k[0] == key[0]}
        stack, seen, reaches_allow = [v], {v}, False
        while stack and not reaches_allow:
            u = stack.pop()
            for w in view.fanout[u]:
                if w in seen or w not in tf_side:
                    continue
                if body.painting.cat[w] == CAT_ALLOW:
                    reaches_allow = True
                    break
                seen.add(w)
                stack.append(w)
        if reaches_allow:
            buckets[UNEXPLAINED].append(("tf-half", key))
        else:
            buckets[TF_HALF_FEEDS_NO_ALLOW].append(key)
    return buckets


def _move_clear_neighbours(
    buckets: dict[str, list],
    pending: list[tuple[tuple[str, str, str], BodyRecord, int]],
    key_maps: dict[str, dict[tuple[str, str, str], int]],
    bucket: str,
) -> None:
    """Moves from ``pending`` to ``bucket`` the TF-only-half clear vertices connected, through
    other such vertices, to a vertex already in ``bucket``: a consequence of that departure.
    TENSOR_LIST_CROSSES_BOUNDARY: TensorFlow paints them half because it paints the list half
    (its Transpose / StridedSlice feeding or reading the list), and with the list float32 they
    have no reason to be half. ACCUMULATOR_GUARD: the Identity nodes that carry a loop variable
    into or out of its running sum, half only because TensorFlow paints the sum half."""
    from tf_amp.painter import CAT_CLEAR

    boundary = {(k[0], key_maps[k[0]][k]) for k in buckets[bucket]}
    changed = True
    while changed:
        changed = False
        for item in list(pending):
            key, body, v = item
            view = body.view
            if body.painting.cat[v] != CAT_CLEAR:
                continue
            if any((key[0], u) in boundary for u in (*view.fanin[v], *view.fanout[v])):
                boundary.add((key[0], v))
                buckets[bucket].append(key)
                pending.remove(item)
                changed = True


def list_boundary_casts(
    before: graph_pb2.GraphDef, ours: graph_pb2.GraphDef, buckets: dict[str, list]
) -> dict[str, int]:
    """Our new Casts, by direction, that read from or feed a TensorList op we keep float32
    where TensorFlow paints it half (TENSOR_LIST_CROSSES_BOUNDARY): TensorFlow saves them only
    by painting a list half on one side of a While boundary and float32 on the other."""
    nodes = {(k[0], k[1]) for k in buckets[TENSOR_LIST_CROSSES_BOUNDARY]}
    old = _casts(before)
    counts = {"to_half": 0, "to_float": 0}
    for body, body_nodes in _bodies(ours):
        body_nodes = list(body_nodes)
        readers: dict[str, list[str]] = {}
        for n in body_nodes:
            for i in n.input:
                readers.setdefault(i.lstrip("^").split(":")[0], []).append(n.name)
        for n in body_nodes:
            if n.op != "Cast" or (body, n.name) in old:
                continue
            src = n.input[0].split(":")[0] if n.input else ""
            touching = [src, *readers.get(n.name, [])]
            if not any((body, t) in nodes and "TensorList" in _op_of(body_nodes, t)
                       for t in touching):
                continue
            if n.attr["DstT"].type in (_HALF, types_pb2.DT_BFLOAT16):
                counts["to_half"] += 1
            else:
                counts["to_float"] += 1
    return counts


def _op_of(nodes: list, name: str) -> str:
    for n in nodes:
        if n.name == name:
            return n.op
    return ""
