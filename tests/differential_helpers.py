"""The checks shared by the differential tests (CPU-mode oracle and the CUDA build's GPU pass)
and the corpus: every differing vertex has a listed reason, Casts <= TensorFlow's."""

from __future__ import annotations

import functools

from tests import _oracle
from tests._model_graphs import ModelGraph
from tf_amp.rewriter import RewriteResult

DIRECTIONS = ("to_half", "to_float")
# The training-step graphs (tests/_model_graphs.py) both differential suites compare on.
FAST_GRAPHS = [
    "keras_cnn",
    "transformer",
    "embedding_encoder",
    "lstm_gru",
    "lstm_gru_inlined",
    "tf1_while_momentum",
    "einsum_attention",
]
SLOW_GRAPHS = ["mobilenet_v2"]


@functools.lru_cache(maxsize=1)
def cpu_oracle_runs_pass_4() -> bool:
    """Whether this process's TensorFlow runs pass 4 (``AddInferToAllowIfFollowAllow``: an infer
    op fed by a half op turns half) in its float16 CPU mode, the in-process oracle.

    TensorFlow 2.19 and older return from that pass unless the mode is oneDNN bfloat16
    (``if (mode_ != AutoMixedPrecisionMode::BF16) return;``), in their CUDA and CPU modes alike;
    2.20 runs it in every mode, as the reference (TensorFlow 2.21's GPU pass, run by the CUDA
    build in its own venv) does. Where it is skipped, the in-process oracle is another pass than
    the reference and cannot second it. Probed on MatMul -> BiasAdd, which only pass 4 paints.
    """
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")
        y = tf.nn.bias_add(tf.matmul(x, tf.ones([8, 8])), tf.ones([8]), name="bias")
        tf.identity(y, name="out")
    out, _ = _oracle.run_tf_pass(graph.as_graph_def(), ["out"])
    bias = next(n for n in out.node if n.name == "bias")
    return bias.attr["T"].type == tf.float16.as_datatype_enum


CPU_ORACLE_SKIPS_PASS_4 = (
    "this TensorFlow's float16 CPU mode skips pass 4 (TF <= 2.19 ran it for oneDNN bfloat16 "
    "only), so it is another pass than the reference, TF 2.21's GPU pass "
    "(tests/test_differential_gpu.py, which still runs here)"
)


def summary(
    label: str,
    model: ModelGraph,
    comparison: _oracle.Comparison,
    buckets: dict[str, list],
    excused: dict[str, int],
) -> str:
    reasons = ", ".join(f"{k}={len(v)}" for k, v in buckets.items() if v) or "none"
    return (
        f"{label}: {len(model.graph_def.node)} nodes, {comparison.vertices} float32 vertices, "
        f"{comparison.differing} differ ({reasons}); casts ours {comparison.ours_casts} vs "
        f"TF {comparison.tf_casts}; ours at TensorLists kept float32 {excused}"
    )


def check_default(
    label: str, model: ModelGraph, result: RewriteResult, comparison: _oracle.Comparison
) -> dict[str, list]:
    """Asserts what the default rewrite promises against a TensorFlow pass; returns buckets."""
    buckets = _oracle.classify(result, comparison)
    excused = _oracle.list_boundary_casts(model.graph_def, result.graph_def, buckets)
    print("\n" + summary(label, model, comparison, buckets, excused))
    assert comparison.vertices > 50
    assert buckets[_oracle.UNEXPLAINED] == [], buckets[_oracle.UNEXPLAINED][:10]
    # the default runs TensorFlow's pass 4 too: no vertex is left to TensorFlow alone for it
    assert buckets[_oracle.TF_HALF_FEEDS_NO_ALLOW] == [], buckets[_oracle.TF_HALF_FEEDS_NO_ALLOW]
    if not buckets[_oracle.TENSOR_LIST_CROSSES_BOUNDARY]:
        assert excused == {"to_half": 0, "to_float": 0}
    # Casts <= TensorFlow's, except those at a TensorList we keep float32 where TensorFlow
    # paints it half on one side of a While only (its graph does not run there)
    for direction in DIRECTIONS:
        ours = comparison.ours_casts[direction] - excused[direction]
        assert ours <= comparison.tf_casts[direction], direction
    # A loop's running sum kept float32 takes its Enter/Merge/Switch/Identity chain along (a
    # lowered gradient loop: 16 vertices per sum), with fewer Casts: not counted as disagreement.
    chains = len(buckets[_oracle.ACCUMULATOR_GUARD])
    assert comparison.agree / (comparison.vertices - chains) > 0.9
    return buckets
