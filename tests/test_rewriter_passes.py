"""Specification tests for the painter passes: tiny graphs, drawn, with expected colours.

Legend: H = becomes float16, F = stays float32. Every graph is built with real TensorFlow ops
in a tf.Graph, rewritten, and (where it can run) executed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2

from tf_amp.config import RewriteConfig
from tf_amp.lists import OpLists
from tf_amp.rewriter import rewrite_graph_def

HALF = types_pb2.DT_HALF
FLOAT = types_pb2.DT_FLOAT
v1 = tf.compat.v1


def build(fn: Callable[[], object]) -> graph_pb2.GraphDef:
    graph = tf.Graph()
    with graph.as_default():
        fn()
    return graph.as_graph_def()


def dtype_of(gd: graph_pb2.GraphDef, name: str, attr: str = "T") -> int:
    node = next(n for n in gd.node if n.name == name)
    return node.attr[attr].type


def new_casts(before: graph_pb2.GraphDef, after: graph_pb2.GraphDef) -> list[str]:
    old = {n.name for n in before.node}
    return sorted(n.name for n in after.node if n.op == "Cast" and n.name not in old)


def run(gd: graph_pb2.GraphDef, fetch: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with v1.Session(graph=graph) as sess:
        return sess.run(fetch + ":0", {k + ":0": v for k, v in feeds.items()})


def mlp() -> None:
    # x ─ MatMul ─ Relu ─ AddV2(+b) ─ Exp ─ Sum
    # w ┘ allow     clear  infer       deny  deny
    #     H         H      F           F     F
    x = v1.placeholder(tf.float32, [4, 8], name="x")
    w = tf.constant(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), name="w")
    h = tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
    a = tf.add(h, 1.0, name="add")
    tf.reduce_sum(tf.exp(a, name="exp"), name="sum")


def test_allow_clear_infer_deny_colours_and_casts() -> None:
    gd = build(mlp)
    result = rewrite_graph_def(gd, RewriteConfig(fold_constant_casts=False))
    out = result.graph_def
    assert dtype_of(out, "mm") == HALF
    assert dtype_of(out, "relu") == HALF
    assert dtype_of(out, "add") == FLOAT
    assert dtype_of(out, "exp") == FLOAT
    # x and the Const w are cast to half; relu's output back to float: 3 casts, 1 counted
    assert new_casts(gd, out) == ["relu-0-CastToFp32-tf_amp", "w-0-CastToFp16-tf_amp",
                                  "x-0-CastToFp16-tf_amp"]
    report = result.report
    assert report.type_attrs_converted == 2
    assert report.casts_to_half == 1  # x only: the Const w is not counted, as TF counts
    assert report.casts_to_float == 1
    assert report.summary_line() == (
        f"Converted 2/{len(gd.node)} nodes to float16 precision using 1 cast(s) to float16 "
        f"(excluding Const and Variable casts)"
    )
    assert report.decision_for("mm").pass_name == "add_allow_list_ops"
    relu = report.decision_for("relu")
    assert relu.pass_name == "propagate_allow_through_clear" and "mm" in relu.cause
    assert "deny list" in report.decision_for("exp").reason
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    want = run(gd, "sum", {"x": x})
    got = run(out, "sum", {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-2)


def test_const_read_only_by_half_ops_is_folded_to_a_half_const() -> None:
    # w(Const) ─ MatMul      default: w itself becomes a half Const, no Cast node
    gd = build(mlp)
    result = rewrite_graph_def(gd)
    out = result.graph_def
    assert dtype_of(out, "w", "dtype") == HALF
    assert node_value(out, "w").dtype == np.float16
    assert new_casts(gd, out) == ["relu-0-CastToFp32-tf_amp", "x-0-CastToFp16-tf_amp"]
    assert result.report.consts_folded == 1
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_allclose(run(out, "sum", {"x": x}), run(gd, "sum", {"x": x}), rtol=1e-2)
    # a Const that a float32 op also reads is left alone (a Cast feeds the half reader)
    both = build(lambda: (mlp(), tf.exp(tf.compat.v1.get_default_graph().get_tensor_by_name(
        "w:0"), name="exp_w")))
    out2 = rewrite_graph_def(both).graph_def
    assert dtype_of(out2, "w", "dtype") == FLOAT
    assert "w-0-CastToFp16-tf_amp" in new_casts(both, out2)
    # preserved and name-preserving: never folded
    out3 = rewrite_graph_def(gd, RewriteConfig(preserve_nodes={"w"})).graph_def
    assert dtype_of(out3, "w", "dtype") == FLOAT
    out4 = rewrite_graph_def(gd, RewriteConfig(preserve_names=True)).graph_def
    assert dtype_of(out4, "w", "dtype") == FLOAT


def test_a_preserved_name_the_graph_lacks_is_named_in_a_warning(caplog) -> None:
    """A mistyped name keeps nothing (the output may turn half): the log must say so."""
    gd = build(mlp)
    with caplog.at_level(logging.WARNING, logger="tf_amp"):
        rewrite_graph_def(gd, RewriteConfig(preserve_nodes={"sum", "no_such_node"}))
    assert "1 node(s) the graph does not have" in caplog.text
    assert "no_such_node" in caplog.text and "sum," not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tf_amp"):
        rewrite_graph_def(gd, RewriteConfig(preserve_nodes={"sum"}))
    assert "does not have" not in caplog.text


def test_a_float32_target_is_said_once_for_many_graphs(caplog) -> None:
    """A tf_amp.Session rewrites the graph again at every import of new nodes; the same
    "left unchanged" line each time is noise."""
    config = RewriteConfig(target_dtype="float32", target_reason="this test's own reason")
    with caplog.at_level(logging.INFO, logger="tf_amp"):
        for _ in range(3):
            result = rewrite_graph_def(build(mlp), config)
    assert result.report.nodes_before > 0 and not result.report.changed
    said = [r.getMessage() for r in caplog.records if "left unchanged" in r.getMessage()]
    assert said == ["target float32, graph left unchanged: this test's own reason"]


def node_value(gd: graph_pb2.GraphDef, name: str) -> np.ndarray:
    node = next(n for n in gd.node if n.name == name)
    return tf.make_ndarray(node.attr["value"].tensor)


def test_infer_between_allow_ops_becomes_half() -> None:
    # x ─ MatMul ─ AddV2 ─ Tanh ─ MatMul ─ Identity(fetch)
    #     allow    infer   infer  allow
    #     H        H       H      H        F (preserved)
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 4], name="x")
        w = tf.ones([4, 4], name="w")
        h = tf.tanh(tf.matmul(x, w, name="mm1") + 1.0, name="tanh")
        tf.identity(tf.matmul(h, w, name="mm2"), name="out")

    gd = build(graph)
    cfg = RewriteConfig(preserve_nodes={"out"}, fold_constant_casts=False)
    result = rewrite_graph_def(gd, cfg)
    out = result.graph_def
    for name in ("mm1", "add", "tanh", "mm2"):
        assert dtype_of(out, name) == HALF, name
    assert dtype_of(out, "out") == FLOAT
    assert result.report.decision_for("tanh").pass_name == "add_clear_and_infer_between_allow"
    # w is cast once and shared by both MatMuls
    assert new_casts(gd, out) == ["add/y-0-CastToFp16-tf_amp", "mm2-0-CastToFp32-tf_amp",
                                  "w-0-CastToFp16-tf_amp", "x-0-CastToFp16-tf_amp"]


def test_deny_propagates_forward_through_infer_but_not_into_clear_feeding_allow() -> None:
    # x ─ Exp ─ AddV2 ─ Sigmoid ─ MatMul          x2 ─ Exp ─ Relu ─ MatMul
    #     deny  infer   infer     allow               deny  clear  allow
    #     F     F(deny) F(deny)   H                   F     H      H
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 2], name="x")
        s = tf.sigmoid(tf.exp(x, name="exp") + 1.0, name="sig")
        tf.matmul(s, s, name="mm")
        x2 = v1.placeholder(tf.float32, [2, 2], name="x2")
        r = tf.nn.relu(tf.exp(x2, name="exp2"), name="relu")
        tf.matmul(r, r, name="mm2")

    gd = build(graph)
    result = rewrite_graph_def(gd)
    out = result.graph_def
    assert dtype_of(out, "add") == FLOAT and dtype_of(out, "sig") == FLOAT
    assert result.report.decision_for("add").paint == "deny"
    assert result.report.decision_for("sig").pass_name == "propagate_deny_forward"
    assert dtype_of(out, "mm") == HALF
    assert dtype_of(out, "relu") == HALF  # clear op feeding only an allow op: not tainted
    assert dtype_of(out, "exp2") == FLOAT


def test_no_allow_ops_means_nothing_to_do(caplog: pytest.LogCaptureFixture) -> None:
    # x ─ Exp ─ Relu      (no allow op at all)
    gd = build(lambda: tf.nn.relu(tf.exp(v1.placeholder(tf.float32, [2], name="x"))))
    with caplog.at_level(logging.INFO, logger="tf_amp"):
        result = rewrite_graph_def(gd)
    # Same message, same deterministic bytes (plain SerializeToString may order map entries,
    # like a node's attrs, differently in a copy: protobuf promises no byte order for maps).
    assert result.graph_def == gd
    deterministic = {"deterministic": True}
    assert result.graph_def.SerializeToString(**deterministic) == gd.SerializeToString(
        **deterministic
    )
    assert result.report.nothing_to_do and result.report.type_attrs_converted == 0
    assert any("nothing to do" in r.getMessage() for r in caplog.records)
    assert not any("Converted" in r.getMessage() for r in caplog.records)


def test_no_float_ops_at_all() -> None:
    gd = build(lambda: tf.matmul(tf.ones([2, 2], tf.int32), tf.ones([2, 2], tf.int32)))
    result = rewrite_graph_def(gd)
    assert result.graph_def == gd
    assert result.report.decisions == []


def test_log_line_once_and_pass_counts_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    gd = build(mlp)
    with caplog.at_level(logging.DEBUG, logger="tf_amp"):
        rewrite_graph_def(gd)
    info = [r for r in caplog.records if r.levelno == logging.INFO]
    converted = [r for r in info if r.getMessage().startswith("Converted ")]
    assert len(converted) == 1
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("propagate_allow_through_clear" in m for m in debug)


def test_existing_cast_to_float_feeding_only_half_is_retargeted() -> None:
    # i(int32) ─ Cast(DstT) ─ MatMul      one Cast int->half, no extra Cast
    #            F->H          H
    def graph() -> None:
        i = v1.placeholder(tf.int32, [2, 2], name="i")
        c = tf.cast(i, tf.float32, name="cast")
        tf.matmul(c, c, name="mm")

    gd = build(graph)
    out = rewrite_graph_def(gd).graph_def
    assert dtype_of(out, "cast", "DstT") == HALF
    assert dtype_of(out, "cast", "SrcT") == types_pb2.DT_INT32
    assert new_casts(gd, out) == []
    got = run(out, "mm", {"i": np.array([[1, 2], [3, 4]], np.int32)})
    np.testing.assert_allclose(got, [[7, 10], [15, 22]])


def test_fused_batch_norm_v3_t_half_u_stays_float() -> None:
    # x ─ Conv2D ─ FusedBatchNormV3 ─ Relu ─ Conv2D
    #     allow    T: infer (H), U: F (scale, offset, mean, var stay float32: no casts)
    def graph() -> None:
        x = v1.placeholder(tf.float32, [1, 4, 4, 2], name="x")
        k = tf.ones([1, 1, 2, 2], name="k")
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv")
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            c, tf.ones([2]), tf.zeros([2]), tf.zeros([2]), tf.ones([2]), is_training=False,
            name="bn",
        )
        tf.nn.conv2d(tf.nn.relu(y, name="relu"), k, 1, "SAME", name="conv2")

    gd = build(graph)
    result = rewrite_graph_def(gd)
    out = result.graph_def
    assert dtype_of(out, "bn", "T") == HALF
    assert dtype_of(out, "bn", "U") == FLOAT
    assert dtype_of(out, "relu") == HALF
    casts = new_casts(gd, out)
    assert not any(name.startswith("ones_") or "zeros" in name for name in casts), casts
    assert result.report.decision_for("bn", "U").reason == (
        "FusedBatchNormV3's OpDef does not allow float16 for U: kept float32")


def test_fused_batch_norm_v1_is_upgraded_to_v2_so_x_can_be_half() -> None:
    # Conv2D ─ FusedBatchNorm(V1: T float-only) ─ Relu ─ Conv2D
    #          becomes FusedBatchNormV2: T H, U F
    def graph() -> None:
        x = v1.placeholder(tf.float32, [1, 4, 4, 2], name="x")
        k = tf.ones([1, 1, 2, 2], name="k")
        c = tf.nn.conv2d(x, k, 1, "SAME", name="conv")
        y = tf.raw_ops.FusedBatchNorm(
            x=c, scale=tf.ones([2]), offset=tf.zeros([2]), mean=tf.zeros([2]),
            variance=tf.ones([2]), is_training=False, name="bn",
        )[0]
        tf.nn.conv2d(tf.nn.relu(y, name="relu"), k, 1, "SAME", name="conv2")

    gd = build(graph)
    out = rewrite_graph_def(gd).graph_def
    bn = next(n for n in out.node if n.name == "bn")
    assert bn.op == "FusedBatchNormV2"
    assert bn.attr["T"].type == HALF and bn.attr["U"].type == FLOAT
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 4, 4, 2)
    np.testing.assert_allclose(run(out, "conv2", {"x": x}), run(gd, "conv2", {"x": x}),
                               rtol=1e-2, atol=1e-2)
    preserved = rewrite_graph_def(gd, RewriteConfig(preserve_nodes={"bn"})).graph_def
    assert next(n for n in preserved.node if n.name == "bn").op == "FusedBatchNorm"


def test_identity_n_elements_are_separate_vertices() -> None:
    # x ─ MatMul ─┐                  element 0: H (clear, next to MatMul)
    # y ─ Exp ────┴ IdentityN ─ ...  element 1: F
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 2], name="x")
        a = tf.matmul(x, x, name="mm")
        b = tf.exp(x, name="exp")
        tf.identity_n([a, b], name="idn")

    gd = build(graph)
    out = rewrite_graph_def(gd).graph_def
    node = next(n for n in out.node if n.name == "idn")
    assert list(node.attr["T"].list.type) == [HALF, FLOAT]


def test_op_on_no_list_keeps_float_with_casts_at_its_edges() -> None:
    # x ─ MatMul ─ Atan ─ MatMul      Atan is on no list: F, one cast each side
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 2], name="x")
        a = tf.atan(tf.matmul(x, x, name="mm1"), name="atan")
        tf.matmul(a, a, name="mm2")

    gd = build(graph)
    result = rewrite_graph_def(gd)
    out = result.graph_def
    assert dtype_of(out, "atan") == FLOAT
    assert new_casts(gd, out) == ["atan-0-CastToFp16-tf_amp", "mm1-0-CastToFp32-tf_amp",
                                  "x-0-CastToFp16-tf_amp"]
    assert "no list" in result.report.decision_for("atan").reason


def test_unregistered_custom_op_is_kept_float_and_reported() -> None:
    # x ─ MatMul ─ MyCustomOp ─ MatMul     custom op unknown to TF: F, casts around it
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 2], name="x")
        a = tf.nn.relu(tf.matmul(x, x, name="mm1"), name="custom")
        tf.matmul(a, a, name="mm2")

    gd = build(graph)
    custom = next(n for n in gd.node if n.name == "custom")
    custom.op = "MyCustomOp"
    result = rewrite_graph_def(gd)
    out = result.graph_def
    assert next(n for n in out.node if n.name == "custom").attr["T"].type == FLOAT
    assert ("", "custom", "MyCustomOp") in result.report.unknown_ops
    casts = new_casts(gd, out)
    assert "mm1-0-CastToFp32-tf_amp" in casts and "custom-0-CastToFp16-tf_amp" in casts


def test_preserved_fetch_and_excluded_scopes_stay_float() -> None:
    # x ─ MatMul (fetch: preserved)   x ─ block/MatMul (exclude_scopes)
    # x ─ MatMul (_tf_amp_exclude)    x ─ MatMul (free: H)
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 2], name="x")
        tf.matmul(x, x, name="fetched")
        with tf.name_scope("block"):
            tf.matmul(x, x, name="mm")
        tf.matmul(x, x, name="attr_excluded")
        tf.matmul(x, x, name="free")

    gd = build(graph)
    node = next(n for n in gd.node if n.name == "attr_excluded")
    node.attr["_tf_amp_exclude"].b = True
    cfg = RewriteConfig(preserve_nodes={"fetched"}, exclude_scopes=("block",))
    result = rewrite_graph_def(gd, cfg)
    out = result.graph_def
    assert dtype_of(out, "fetched") == FLOAT
    assert dtype_of(out, "block/mm") == FLOAT
    assert dtype_of(out, "attr_excluded") == FLOAT
    assert dtype_of(out, "free") == HALF
    assert "preserved" in result.report.decision_for("fetched").reason
    assert "excluded" in result.report.decision_for("block/mm").reason


def test_float32_views_do_not_exclude_the_gradients_of_their_op_in_a_later_rewrite() -> None:
    # 1st rewrite, O1, name-preserving,            2nd rewrite of its output, O3:
    # ReluGrad on the deny list:
    # x ─ mm ─ relu ─ exp ─ loss                   "mm", "relu": float32 views (Casts), kept
    #   mm, relu: H under new names                gradients/relu_grad/ReluGrad: H
    #   gradients/relu_grad/ReluGrad: F
    # The views are marked so that no later rewrite paints them, but they are not an excluded
    # forward region: the gradient ops named after them must stay free to turn half.
    def graph() -> None:
        x = v1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), name="w")
        h = tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
        loss = tf.reduce_sum(tf.exp(h, name="exp"), name="loss")
        tf.gradients(loss, [x], name="gradients")

    gd = build(graph)
    grad = "gradients/relu_grad/ReluGrad"
    deny_relu_grad = OpLists.default("float16").with_edits([("deny", "ADD", "ReluGrad")])
    first = rewrite_graph_def(
        gd, RewriteConfig(preserve_names=True, preserve_nodes={"loss"}, lists=deny_relu_grad)
    )
    assert {"mm", "relu"} <= set(first.report.renamed)
    assert dtype_of(first.graph_def, grad) == FLOAT
    second = rewrite_graph_def(
        first.graph_def, RewriteConfig(opt_level="O3", preserve_nodes={"loss"})
    )
    assert dtype_of(second.graph_def, grad) == HALF
    for view in ("mm", "relu"):
        assert dtype_of(second.graph_def, view, "DstT") == FLOAT
        assert "float32 view" in second.report.decision_for(view, "DstT").reason
    # (not a linspace: its symmetric values put a relu input at exactly 0, where float16
    # rounding flips the relu gradient)
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    want = run(gd, "gradients/mm_grad/MatMul", {"x": x})
    got = run(second.graph_def, "gradients/mm_grad/MatMul", {"x": x})
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("level", ["O2", "O3"])
def test_ops_whose_dtype_is_their_meaning_stay_float32_at_every_level(level: str) -> None:
    #      ┌ Bitcast(→int32) ─ >>23 ─┐
    # x ─ mm ─ Range(0., 4.) * ──────┼─ out     mm: H; Bitcast, Range, PyFunc,
    #      ├ numpy_function(*2) ─────┤          EagerPyFunc: F (they compute with the dtype
    #      └ py_function(*3) ────────┘          itself: bits, counting, Python code)
    def graph() -> None:
        x = v1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.constant(np.linspace(0.5, 1.5, 16, dtype=np.float32).reshape(4, 4), name="w")
        m = tf.matmul(x, w, name="mm")
        exponent = tf.bitwise.right_shift(tf.bitcast(m, tf.int32, name="bitcast"), 23)
        bits = tf.cast(exponent, tf.float32)  # the float32 exponent field: about 127
        counted = tf.range(0.0, 4.0, name="range") * m
        doubled = tf.numpy_function(lambda t: t * 2, [m], tf.float32, name="np_fn")
        tripled = tf.py_function(lambda t: t * 3, [m], tf.float32, name="py_fn")
        tf.identity(bits + counted + doubled + tripled, name="out")

    # Python function bodies are registered for as long as their graph lives: keep it.
    original = tf.Graph()
    with original.as_default():
        graph()
    gd = original.as_graph_def()
    result = rewrite_graph_def(gd, RewriteConfig(preserve_nodes={"x", "out"}, opt_level=level))
    out = result.graph_def
    assert dtype_of(out, "mm") == HALF
    assert dtype_of(out, "bitcast") == FLOAT
    assert dtype_of(out, "range", "Tidx") == FLOAT
    for name in ("np_fn", "py_fn"):
        node = next(n for n in out.node if n.name == name)
        assert list(node.attr["Tin"].list.type) == [FLOAT], name
        assert list(node.attr["Tout"].list.type) == [FLOAT], name
    assert "Bitcast computes with its dtype" in result.report.decision_for("bitcast").reason
    x = np.random.default_rng(0).uniform(0.5, 1.0, size=(4, 4)).astype(np.float32)
    np.testing.assert_allclose(
        run(out, "out", {"x": x}), run(gd, "out", {"x": x}), rtol=2e-2, atol=0.1
    )


def test_bfloat16_target() -> None:
    gd = build(mlp)
    result = rewrite_graph_def(gd, RewriteConfig(target_dtype="bfloat16"))
    assert dtype_of(result.graph_def, "mm") == types_pb2.DT_BFLOAT16
    assert "bfloat16 precision" in result.report.summary_line()
    assert any("CastToBf16" in n for n in new_casts(gd, result.graph_def))


@pytest.mark.parametrize(
    ("level", "add", "exp"),
    [("O1", FLOAT, FLOAT), ("O2", HALF, FLOAT), ("O3", HALF, HALF)],
)
def test_opt_levels(level: str, add: int, exp: int) -> None:
    # O1: lists; O2: every half-capable op except deny; O3: everything with a half kernel
    gd = build(mlp)
    cfg = RewriteConfig(opt_level=level, fold_constant_casts=False)
    out = rewrite_graph_def(gd, cfg).graph_def
    assert dtype_of(out, "mm") == HALF
    assert dtype_of(out, "add") == add
    assert dtype_of(out, "exp") == exp
    assert dtype_of(out, "x", "dtype") == FLOAT  # feeds never change
    assert dtype_of(out, "w", "dtype") == FLOAT  # nor constants


def test_opt_level_o0_changes_nothing() -> None:
    gd = build(mlp)
    result = rewrite_graph_def(gd, RewriteConfig(opt_level="O0"))
    assert result.graph_def == gd and result.report.type_attrs_converted == 0


@pytest.mark.parametrize(
    ("level", "relu", "add"),
    [
        ("TENSOR_CORES_ONLY", FLOAT, FLOAT),  # only allow-list ops: Relu not propagated
        ("TREAT_INFER_AS_DENY", HALF, FLOAT),
        ("UNSAFE_FORCE_ALL", HALF, HALF),
    ],
)
def test_tf_levels(level: str, relu: int, add: int) -> None:
    gd = build(mlp)
    out = rewrite_graph_def(gd, RewriteConfig(level=level)).graph_def
    assert dtype_of(out, "mm") == HALF
    assert dtype_of(out, "relu") == relu
    assert dtype_of(out, "add") == add


def test_custom_lists_move_an_op() -> None:
    gd = build(mlp)
    lists = OpLists.default().with_edits([("allow", "ADD", "AddV2")])
    out = rewrite_graph_def(gd, RewriteConfig(lists=lists)).graph_def
    assert dtype_of(out, "add") == HALF


def test_eligible_devices_gpu_only_touches_gpu_nodes() -> None:
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 2], name="x")
        with tf.device("/device:GPU:0"):
            tf.matmul(x, x, name="on_gpu")
        with tf.device("/device:CPU:0"):
            tf.matmul(x, x, name="on_cpu")
        tf.matmul(x, x, name="nowhere")

    gd = build(graph)
    cfg = RewriteConfig(eligible_devices="gpu", check_kernels=False)
    out = rewrite_graph_def(gd, cfg).graph_def
    assert dtype_of(out, "on_gpu") == HALF
    assert dtype_of(out, "on_cpu") == FLOAT
    assert dtype_of(out, "nowhere") == FLOAT
    # with the kernel check on, this CPU-only TensorFlow has no GPU kernels: nothing changes
    cfg = RewriteConfig(eligible_devices="gpu")
    assert dtype_of(rewrite_graph_def(gd, cfg).graph_def, "on_gpu") == FLOAT


def test_infer_follows_allow_is_tensorflows_pass_4_and_the_default() -> None:
    # x ─ MatMul ─ BiasAdd ─ Mul ─ AddV2(+ deny-tainted) ─ ...   no second allow op
    #     allow    infer     infer  infer (deny: fed by Exp)
    #     H        H / F     H / F  F          default / infer_follows_allow=False
    # TensorFlow 2.21 runs this pass (AddInferToAllowIfFollowAllow) in its CUDA GPU pass too
    # (tests/test_differential_gpu.py), so it is on by default; an earlier version of this test
    # asserted the opposite default, on the wrong belief that only the CPU mode runs it.
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 2], name="x")
        b = tf.nn.bias_add(tf.matmul(x, x, name="mm"), tf.ones([2]), name="bias")
        m = tf.multiply(b, 2.0, name="mul")
        tf.add(m, tf.exp(x, name="exp"), name="add")

    gd = build(graph)
    off = rewrite_graph_def(gd, RewriteConfig(infer_follows_allow=False)).graph_def
    assert dtype_of(off, "bias") == FLOAT and dtype_of(off, "mul") == FLOAT
    result = rewrite_graph_def(gd)
    out = result.graph_def
    assert dtype_of(out, "bias") == HALF and dtype_of(out, "mul") == HALF
    assert dtype_of(out, "add") == FLOAT
    assert result.report.decision_for("mul").pass_name == "add_infer_following_allow"
    # here no Cast is saved: the half values end in a Cast back to float32 anyway
    assert len(new_casts(gd, out)) >= len(new_casts(gd, off))


def test_the_converted_line_counts_the_same_nodes_whatever_the_target() -> None:
    # The Y of "Converted X/Y" counted the library's nodes when a body was painted and only
    # the main graph's when the target was float32 or the level O0.
    w = tf.Variable(tf.ones((8, 8)))

    @tf.function
    def step(x, n):
        _, y = tf.while_loop(lambda i, y: i < n, lambda i, y: (i + 1, tf.matmul(y, w)), (0, x))
        return tf.reduce_sum(y)

    graph_def = step.get_concrete_function(
        tf.TensorSpec([4, 8]), tf.TensorSpec([], tf.int32)
    ).graph.as_graph_def()
    total = len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)
    configs = (RewriteConfig(target_dtype="float16"), RewriteConfig(target_dtype="float32"),
               RewriteConfig(target_dtype="float16", opt_level="O0"))
    assert [rewrite_graph_def(graph_def, c).report.nodes_before for c in configs] == [total] * 3
    assert total > len(graph_def.node)


def test_keras_compiled_loss_and_its_gradient_stay_float32_unless_asked() -> None:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        p = tf.sigmoid(tf.matmul(x, tf.ones((8, 1))), name="p")
        with tf.name_scope("compile_loss"):
            clipped = tf.clip_by_value(p, 1e-7, 1.0 - 1e-7)
            loss = tf.reduce_mean(-tf.math.log(1.0 - clipped), name="loss")
        with tf.name_scope("gradient_tape/compile_loss"):
            grad = tf.multiply(loss, tf.ones((4, 1)), name="grad")
        tf.identity(tf.matmul(tf.transpose(x), grad), name="out")
    config = RewriteConfig(target_dtype="bfloat16", preserve_nodes=frozenset({"x", "out"}))
    for guarded, result in ((True, rewrite_graph_def(graph.as_graph_def(), config)),
                            (False, rewrite_graph_def(graph.as_graph_def(),
                                                      config.replace(guard_losses=False)))):
        colours = result.report.colours()
        minimum = colours[("compile_loss/clip_by_value/Minimum", "T")]
        grad = colours[("gradient_tape/compile_loss/grad", "T")]
        assert (minimum, grad) == (("float32", "float32") if guarded else ("allow", "allow"))
    decision = rewrite_graph_def(graph.as_graph_def(), config).report.decision_for(
        "compile_loss/clip_by_value/Minimum")
    assert "Keras model's loss" in decision.reason


def test_tf_keras_loss_scopes_and_their_gradients_stay_float32() -> None:
    # tf_keras names no compile scope: each Loss runs under its own name and reduces through
    # <scope>/weighted_loss/value; a scope without that node is not a loss.
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        p = tf.sigmoid(tf.matmul(x, tf.ones((8, 1))), name="p")
        with tf.name_scope("binary_crossentropy"):
            clipped = tf.clip_by_value(p, 1e-7, 1.0 - 1e-7)
            with tf.name_scope("weighted_loss"):
                loss = tf.reduce_mean(-tf.math.log(1.0 - clipped), name="value")
        with tf.name_scope("gradient_tape/binary_crossentropy"):
            grad = tf.multiply(loss, tf.ones((4, 1)), name="grad")
        with tf.name_scope("not_a_loss"):
            other = tf.matmul(grad, tf.ones((1, 1)), name="other")
        tf.identity(tf.matmul(tf.transpose(x), other), name="out")
    config = RewriteConfig(target_dtype="float16", preserve_nodes=frozenset({"x", "out"}))
    colours = rewrite_graph_def(graph.as_graph_def(), config).report.colours()
    assert colours[("binary_crossentropy/clip_by_value/Minimum", "T")] == "float32"
    assert colours[("gradient_tape/binary_crossentropy/grad", "T")] == "float32"
    assert colours[("not_a_loss/other", "T")] == "allow"


def test_a_float32_vertex_names_the_deny_list_op_it_follows() -> None:
    """The reason named the previous op on the path as the "float32-only op" (Relu, Tanh:
    neither is on the deny list) and said an infer op "feeds a deny/infer op" where it fed
    only a MatMul."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(0.1, tf.float32, [8, 8], name="w")
        e = tf.exp(tf.matmul(x, w, name="mm1"), name="exp")  # deny
        s = tf.sigmoid(tf.tanh(tf.nn.relu(e, name="relu"), name="tanh"), name="sigmoid")
        tf.identity(tf.matmul(s, w, name="mm2"), name="out")
    config = RewriteConfig(target_dtype="float16", check_kernels=False,
                           preserve_nodes=frozenset({"out"}))
    report = rewrite_graph_def(graph.as_graph_def(), config).report
    for node in ("relu", "tanh", "sigmoid"):
        decision = report.decision_for(node)
        assert decision.dtype == "float32" and decision.cause.startswith("exp (Exp)"), decision
    assert "feeds a deny/infer op" in report.decision_for("relu").reason  # a clear op
    assert "feeds a deny/infer op" not in report.decision_for("sigmoid").reason  # infer
