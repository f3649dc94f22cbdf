"""Structure tests: loops, TensorLists, library functions, name-preserving mode, bad input,
purity / idempotence / determinism, variables, and the log directory.

Every rewritten graph that can run is imported and executed, and compared with float32.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, types_pb2

from tests import _model_graphs
from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def
from tf_amp.type_attrs import GraphRewriteError

HALF = types_pb2.DT_HALF
FLOAT = types_pb2.DT_FLOAT
v1 = tf.compat.v1


def build(fn) -> graph_pb2.GraphDef:  # noqa: ANN001 - any zero-arg builder
    graph = tf.Graph()
    with graph.as_default():
        fn()
    return graph.as_graph_def()


def node(gd: graph_pb2.GraphDef, name: str):  # noqa: ANN201 - NodeDef
    return next(n for n in gd.node if n.name == name)


def run(gd: graph_pb2.GraphDef, fetches: list[str], feeds: dict[str, np.ndarray],
        init: str | None = None) -> list[np.ndarray]:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with v1.Session(graph=graph) as sess:
        if init:
            sess.run(init)
        return sess.run(fetches, {k + ":0": v for k, v in feeds.items()})


# ---------------------------------------------------------------------------- v1 loops
@pytest.fixture(scope="module")
def tf1_graph() -> _model_graphs.ModelGraph:
    return _model_graphs.tf1_while_momentum()


def test_v1_loop_recurrent_edges_have_one_colour_and_graph_trains(tf1_graph) -> None:  # noqa: ANN001
    #  Enter ─ Merge ─ Switch ─ Identity ─ MatMul ─ AddV2 ─ Tanh ─ NextIteration ─┐
    #           └──────────────────────────────────────────────────────────────────┘
    #  Merge and NextIteration: same colour, so no Cast sits on the back edge.
    gd = tf1_graph.graph_def
    result = rewrite_graph_def(gd, RewriteConfig(preserve_nodes=frozenset(tf1_graph.fetches)))
    out = result.graph_def
    by_name = {n.name: n for n in out.node}
    checked = 0
    for n in out.node:
        if n.op != "NextIteration":
            continue
        for consumer in out.node:
            if any(i.split(":")[0] == n.name for i in consumer.input):
                assert consumer.op == "Merge", "a Cast on a loop back edge"
                assert consumer.attr["T"].type == n.attr["T"].type
                checked += 1
    assert checked >= 2
    assert by_name["while/MatMul"].attr["T"].type == HALF
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(8, 16)
    want = run(gd, ["loss:0", "train"], {"x": x}, init="init")[0]
    got = run(out, ["loss:0", "train"], {"x": x}, init="init")[0]
    np.testing.assert_allclose(got, want, rtol=2e-2)


def test_tf1_ref_variables_and_gradient_descent() -> None:
    # VariableV2 ─ Identity(read) ─ MatMul ─ ... ─ ApplyGradientDescent(ref)
    # the variable, its Identity read and the update stay float32; the graph trains
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [4, 8], name="x")
        w = v1.get_variable("w", [8, 8], initializer=v1.constant_initializer(0.1),
                            use_resource=False)
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w, name="mm")), name="loss")
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        v1.global_variables_initializer()
    gd = graph.as_graph_def()
    out = rewrite_graph_def(gd, RewriteConfig(preserve_nodes={"loss", "train", "init"})).graph_def
    assert node(out, "mm").attr["T"].type == HALF
    assert node(out, "w").attr["dtype"].type == FLOAT
    assert node(out, "w/read").attr["T"].type == FLOAT  # implicit ref read: not painted
    assert node(out, "train/update_w/ApplyGradientDescent").attr["T"].type == FLOAT
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    want = run(gd, ["loss:0", "train"], {"x": x}, init="init")[0]
    got = run(out, ["loss:0", "train"], {"x": x}, init="init")[0]
    np.testing.assert_allclose(got, want, rtol=1e-2)


def test_variables_stay_float32_at_every_level(tf1_graph) -> None:  # noqa: ANN001
    for level in ("O1", "O2", "O3"):
        cfg = RewriteConfig(opt_level=level, preserve_nodes=frozenset(tf1_graph.fetches))
        out = rewrite_graph_def(tf1_graph.graph_def, cfg).graph_def
        for n in out.node:
            if n.op in ("VarHandleOp", "ReadVariableOp", "AssignVariableOp"):
                assert n.attr["dtype"].type == FLOAT, (level, n.name)
            if n.op.startswith("ResourceApply"):
                assert n.attr["T"].type == FLOAT, (level, n.name)


# ---------------------------------------------------------------------------- TensorList
def test_tensor_list_cluster_takes_one_colour() -> None:
    # x ─ MatMul ─ TensorListSetItem(Reserve) ─ TensorListGetItem ─ MatMul
    #     H        element_dtype H, on Reserve / SetItem / GetItem alike; no casts between
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 2], name="x")
        a = tf.matmul(x, x, name="mm1")
        lst = tf.raw_ops.TensorListReserve(
            element_shape=[2, 2], num_elements=1, element_dtype=tf.float32, name="reserve"
        )
        lst = tf.raw_ops.TensorListSetItem(input_handle=lst, index=0, item=a, name="set")
        item = tf.raw_ops.TensorListGetItem(
            input_handle=lst, index=0, element_shape=[2, 2], element_dtype=tf.float32,
            name="get",
        )
        tf.matmul(item, item, name="mm2")

    gd = build(graph)
    out = rewrite_graph_def(gd).graph_def
    for name in ("reserve", "set", "get"):
        assert node(out, name).attr["element_dtype"].type == HALF, name
    assert not [n for n in out.node if n.op == "Cast" and "mm1" in n.name]
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    np.testing.assert_allclose(run(out, ["mm2:0"], {"x": x})[0],
                               run(gd, ["mm2:0"], {"x": x})[0], rtol=1e-2)


def test_tensor_list_from_a_feed_is_denied() -> None:
    # handle(Placeholder variant) ─ TensorListGetItem ─ MatMul:  the list comes from outside,
    # so its element type cannot change: GetItem F, Cast to half before the MatMul.
    def graph() -> None:
        handle = v1.placeholder(tf.variant, [], name="handle")
        item = tf.raw_ops.TensorListGetItem(
            input_handle=handle, index=0, element_shape=[2, 2], element_dtype=tf.float32,
            name="get",
        )
        tf.matmul(item, item, name="mm")

    gd = build(graph)
    result = rewrite_graph_def(gd)
    assert node(result.graph_def, "get").attr["element_dtype"].type == FLOAT
    assert node(result.graph_def, "mm").attr["T"].type == HALF
    assert "boundary" in result.report.decision_for("get", "element_dtype").reason


# ---------------------------------------------------------------------------- functions
def test_while_body_and_non_inlined_function_are_rewritten() -> None:
    #  main: x ─ While(body: MatMul ─ Tanh) ─ If(then: MatMul) ─ inner(MatMul) ─ Sum
    #  body, branches and inner are library functions: rewritten inside, signatures unchanged,
    #  a Cast back to float before each half `ret`.
    @tf.function(experimental_attributes={"_noinline": True})
    def inner(a: tf.Tensor) -> tf.Tensor:
        return tf.matmul(a, a)

    @tf.function
    def f(x: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return i + 1, tf.tanh(tf.matmul(h, w))

        _, h = tf.while_loop(lambda i, h: i < 3, body, [tf.constant(0), x])
        h = tf.cond(tf.reduce_sum(h) > 0, lambda: tf.matmul(h, w), lambda: h * 2.0)
        return tf.reduce_sum(inner(h))

    spec = tf.TensorSpec([4, 4], tf.float32)
    concrete = f.get_concrete_function(spec, spec)
    gd = concrete.graph.as_graph_def()
    result = rewrite_graph_def(gd)
    out = result.graph_def
    assert result.report.functions_rewritten >= 2
    sigs_before = {fd.signature.name: fd.signature for fd in gd.library.function}
    matmuls = 0
    for fdef in out.library.function:
        assert fdef.signature == sigs_before[fdef.signature.name]  # call sites stay valid
        for n in fdef.node_def:
            if n.op == "MatMul":
                assert n.attr["T"].type == HALF
                matmuls += 1
        for key, ref in fdef.ret.items():
            producer = next((n for n in fdef.node_def if n.name == ref.split(":")[0]), None)
            if producer is not None and producer.op == "Cast":
                assert producer.attr["DstT"].type == FLOAT, key
    assert matmuls == 3
    x = np.full([4, 4], 0.1, np.float32)
    fetch = concrete.outputs[0].name
    feeds = {t.name.split(":")[0]: x for t in concrete.inputs}
    want = run(gd, [fetch], feeds)[0]
    got = run(out, [fetch], feeds)[0]
    np.testing.assert_allclose(got, want, rtol=2e-2)


# ---------------------------------------------------------------------------- name preserving
def mlp() -> None:
    x = v1.placeholder(tf.float32, [4, 8], name="x")
    w = tf.constant(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), name="w")
    h = tf.nn.relu(tf.matmul(x, w, name="mm"), name="relu")
    s, _ = tf.split(h, 2, axis=1, name="split")
    tf.reduce_sum(tf.exp(s + 1.0, name="exp"), name="sum")


def test_name_preserving_mode_keeps_every_tensor_dtype() -> None:
    # mm, relu, split become half under new names; "mm", "relu", "split:0", "split:1" stay
    # float32 tensors (Casts / an IdentityN take the old names).
    gd = build(mlp)
    result = rewrite_graph_def(gd, RewriteConfig(preserve_names=True))
    out = result.graph_def
    assert set(result.report.renamed) >= {"mm", "relu", "split"}
    assert node(out, result.report.renamed["mm"]).attr["T"].type == HALF
    before, after = tf.Graph(), tf.Graph()
    with before.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with after.as_default():
        tf.graph_util.import_graph_def(out, name="")
    for op in before.get_operations():
        new_op = after.get_operation_by_name(op.name)
        assert [t.dtype for t in new_op.outputs] == [t.dtype for t in op.outputs], op.name
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    fetches = ["relu:0", "split:1", "sum:0"]
    for got, want in zip(run(out, fetches, {"x": x}), run(gd, fetches, {"x": x}), strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_name_preserving_mode_keeps_a_switch_and_its_control_edges_live() -> None:
    # x ─ mm ─ Switch(p) ─┬ :1 * 1 ─ t ─┐        mm, sw: H under new names; the float32 view
    #                     └ :0 * 2 ─ f ─┴ Merge   "sw" must itself be a Switch: an IdentityN
    #          ^sw ─ gate (NoOp) ─ ^ t            of both ports is dead whatever p is (one
    #                                             port always is), and so is all that reads it.
    def graph() -> None:
        x = v1.placeholder(tf.float32, [2, 4], name="x")
        p = v1.placeholder(tf.bool, [], name="p")
        w = tf.constant(np.linspace(0.5, 1.5, 16, dtype=np.float32).reshape(4, 4), name="w")
        m = tf.matmul(x, w, name="mm")
        sw = tf.raw_ops.Switch(data=m, pred=p, name="sw")
        with tf.control_dependencies([sw.output_true.op]):  # as lowered While/If bodies have
            gate = tf.no_op(name="gate")
        with tf.control_dependencies([gate]):
            t = tf.identity(sw.output_true * 1.0, name="t")
        f = tf.identity(sw.output_false * 2.0, name="f")
        tf.identity(tf.raw_ops.Merge(inputs=[t, f]).output, name="out")

    gd = build(graph)
    result = rewrite_graph_def(gd, RewriteConfig(preserve_names=True))
    out = result.graph_def
    assert "sw" in result.report.renamed
    assert node(out, result.report.renamed["sw"]).attr["T"].type == HALF
    assert node(out, "sw").op == "Switch" and node(out, "sw").attr["T"].type == FLOAT
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    for pred, port in ((True, "sw:1"), (False, "sw:0")):
        feeds = {"x": x, "p": np.array(pred)}
        got = run(out, ["out:0", port], feeds)
        want = run(gd, ["out:0", port], feeds)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == np.float32
            np.testing.assert_allclose(g, w, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("fold", [True, False], ids=["folded_consts", "cast_consts"])
def test_every_decision_states_the_dtype_the_output_graph_has(fold: bool) -> None:
    # Folded Consts included: they were reported float32 while the graph held them in half.
    gd = build(mlp)
    result = rewrite_graph_def(gd, RewriteConfig(fold_constant_casts=fold))
    out = {n.name: n for n in result.graph_def.node}
    words = {"float32": FLOAT, "float16": HALF}
    checked = 0
    for decision in result.report.decisions:
        if decision.body or "[" in decision.attr:
            continue
        assert out[decision.node].attr[decision.attr].type == words[decision.dtype], decision
        checked += 1
    assert checked >= 5
    w = result.report.decision_for("w", "dtype")
    assert (w.dtype == "float16") == fold
    if fold:
        assert "folded" in w.reason


def test_v1_loop_listed_out_of_order_is_no_cycle(tf1_graph) -> None:  # noqa: ANN001
    # Nodes listed consumers first take the full cycle check, which must not count the loop's
    # own back edge (NextIteration -> Merge) as a cycle.
    gd = tf1_graph.graph_def
    shuffled = graph_pb2.GraphDef()
    shuffled.CopyFrom(gd)
    del shuffled.node[:]
    shuffled.node.extend(reversed(gd.node))
    config = RewriteConfig(preserve_nodes=frozenset(tf1_graph.fetches))
    in_order = rewrite_graph_def(gd, config).report
    reversed_order = rewrite_graph_def(shuffled, config).report
    assert reversed_order.type_attrs_converted == in_order.type_attrs_converted > 0


# ---------------------------------------------------------------------------- contracts
def test_pure_idempotent_deterministic(tf1_graph) -> None:  # noqa: ANN001
    for gd in (build(mlp), tf1_graph.graph_def):
        snapshot = gd.SerializeToString(deterministic=True)
        first = rewrite_graph_def(gd).graph_def
        assert gd.SerializeToString(deterministic=True) == snapshot  # input untouched
        again = rewrite_graph_def(gd).graph_def
        assert first.SerializeToString(deterministic=True) == again.SerializeToString(
            deterministic=True
        )
        twice = rewrite_graph_def(first)
        assert twice.report.type_attrs_converted == 0
        assert twice.graph_def.SerializeToString(
            deterministic=True
        ) == first.SerializeToString(deterministic=True)


def _duplicate_mm(gd: graph_pb2.GraphDef) -> None:
    gd.node.add().CopyFrom(node(gd, "mm"))


def _dangling_input(gd: graph_pb2.GraphDef) -> None:
    node(gd, "relu").input[0] = "nowhere:0"


def _missing_input(gd: graph_pb2.GraphDef) -> None:
    del node(gd, "mm").input[1]


def _bad_port(gd: graph_pb2.GraphDef) -> None:
    node(gd, "relu").input[0] = "mm:3"


def _cycle_through_mm(gd: graph_pb2.GraphDef) -> None:
    node(gd, "mm").input[0] = "relu"  # relu reads mm: a cycle no NextIteration breaks


def _untyped_matmul(gd: graph_pb2.GraphDef) -> None:
    del node(gd, "mm").attr["T"]  # one type attribute: read on the single-attr path


def _untyped_sum(gd: graph_pb2.GraphDef) -> None:
    del node(gd, "sum").attr["T"]  # Sum has T and Tidx: read on the several-attrs path


def _list_where_matmul_type_belongs(gd: graph_pb2.GraphDef) -> None:
    node(gd, "mm").attr["T"].list.type.append(types_pb2.DT_FLOAT)


def _int_where_sum_type_belongs(gd: graph_pb2.GraphDef) -> None:
    node(gd, "sum").attr["T"].i = 1


@pytest.mark.parametrize(
    ("break_graph", "error", "message"),
    [
        (_duplicate_mm, GraphRewriteError, "Duplicate node name 'mm'"),
        (_dangling_input, ValueError, "'nowhere:0' that names no node"),
        (_missing_input, GraphRewriteError, "expects 2"),
        (_bad_port, GraphRewriteError, "only 1 output"),
        # Was painted and returned: TensorFlow refuses it ("2 nodes in a cycle").
        (_cycle_through_mm, GraphRewriteError,
         "cycle that no NextIteration breaks: (mm -> relu -> mm|relu -> mm -> relu)"),
        # Was "no allow-list ops found, nothing to do": a missing dtype read as not float.
        (_untyped_matmul, GraphRewriteError, "'mm' \\(MatMul\\) has no 'T' attribute"),
        (_untyped_sum, GraphRewriteError, "'sum' \\(Sum\\) has no 'T' attribute"),
        # Also "nothing to do": a value that is not a type read as not float32.
        (_list_where_matmul_type_belongs, GraphRewriteError,
         "'mm' \\(MatMul\\) has a list value in its 'T' attribute, where its op expects a type"),
        (_int_where_sum_type_belongs, GraphRewriteError,
         "'sum' \\(Sum\\) has an int value in its 'T' attribute"),
    ],
)
def test_malformed_graph_gives_a_clear_error(break_graph, error, message) -> None:  # noqa: ANN001
    broken = build(mlp)
    break_graph(broken)
    with pytest.raises(error, match=message):
        rewrite_graph_def(broken)


def test_a_left_out_type_attribute_with_a_default_takes_the_default() -> None:
    whole, trimmed = build(mlp), build(mlp)
    del node(trimmed, "sum").attr["Tidx"]  # Sum's Tidx defaults to int32
    expected = rewrite_graph_def(whole).graph_def
    del node(expected, "sum").attr["Tidx"]
    got = rewrite_graph_def(trimmed).graph_def
    assert got.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )


def test_non_graph_def_input_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="GraphDef"):
        rewrite_graph_def(build(mlp).SerializeToString())  # type: ignore[arg-type]


def test_empty_graph_is_nothing_to_do() -> None:
    result = rewrite_graph_def(graph_pb2.GraphDef())
    assert result.report.nothing_to_do and len(result.graph_def.node) == 0


# ---------------------------------------------------------------------------- log dir
def test_a_log_dir_that_cannot_be_written_is_a_clear_error(tmp_path, tf1_graph) -> None:  # noqa: ANN001
    """The error names the log directory and the variables that set it, not just an errno
    from deep inside a training step; the input graph is left as it was."""
    gd = tf1_graph.graph_def
    before = gd.SerializeToString()
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for bad, kind in ((a_file, FileExistsError), (a_file / "logs", NotADirectoryError)):
        cfg = RewriteConfig(log_dir=str(bad), preserve_nodes=frozenset(tf1_graph.fetches))
        with pytest.raises(kind, match=r"rewrite logs to .*TF_AMP_LOG_PATH"):
            rewrite_graph_def(gd, cfg)
    assert gd.SerializeToString() == before


def test_log_dir_files_and_tensorboard_event(tmp_path, tf1_graph) -> None:  # noqa: ANN001
    gd = tf1_graph.graph_def
    assert any("_class" in n.attr for n in gd.node)  # TF1 variables carry colocation
    cfg = RewriteConfig(log_dir=str(tmp_path), preserve_nodes=frozenset(tf1_graph.fetches))
    result = rewrite_graph_def(gd, cfg)
    names = os.listdir(tmp_path)
    for prefix, suffix in [("graphdef_preop_", ".pb"), ("graphdef_preop_", ".pbtxt"),
                           ("graphdef_AutoMixedPrecision_", ".pb"),
                           ("graphdef_AutoMixedPrecision_", ".pbtxt"),
                           ("paintbuckets_AutoMixedPrecision_", ".txt"),
                           ("decisions_AutoMixedPrecision_", ".jsonl")]:
        assert any(n.startswith(prefix) and n.endswith(suffix) for n in names), prefix + suffix
    after_pb = next(n for n in names if n.startswith("graphdef_AutoM") and n.endswith(".pb"))
    loaded = graph_pb2.GraphDef()
    with open(tmp_path / after_pb, "rb") as f:
        loaded.ParseFromString(f.read())
    assert loaded == result.graph_def
    buckets = next(n for n in names if n.startswith("paintbuckets_"))
    text = (tmp_path / buckets).read_text()
    assert "ALLOW (" in text and "\nAllowList:\nBatchMatMul" in text
    jsonl = next(n for n in names if n.startswith("decisions_"))
    with open(tmp_path / jsonl) as f:
        lines = [json.loads(line) for line in f]
    assert lines[0]["summary"] == result.report.summary_line()
    assert {"node", "attr", "dtype", "reason", "pass"} <= set(lines[1])
    assert len(lines) - 1 == len(result.report.decisions)
    events = sorted(glob.glob(str(tmp_path / "tensorboard" / "*" / "*" / "events*")))
    assert len(events) == 2  # before and after runs
    for path in events:
        graphs = [e.graph_def for e in v1.train.summary_iterator(path) if e.graph_def]
        assert len(graphs) == 1
        board = graph_pb2.GraphDef()
        board.ParseFromString(graphs[0])
        assert not any("_class" in n.attr for n in board.node)
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(board, name="")  # loads: TensorBoard can too


def test_the_logged_decisions_name_a_kept_names_converted_op(tmp_path, tf1_graph) -> None:  # noqa: ANN001
    """With the original names kept (tf_amp.Session), a converted node's name is a Cast (an
    IdentityN of Casts, a float32 Switch) in the logged after-graph and its op is renamed; the
    decisions said neither."""
    cfg = RewriteConfig(log_dir=str(tmp_path), preserve_nodes=frozenset(tf1_graph.fetches),
                        preserve_names=True)
    result = rewrite_graph_def(tf1_graph.graph_def, cfg)
    assert result.report.renamed
    jsonl = next(n for n in os.listdir(tmp_path) if n.startswith("decisions_"))
    with open(tmp_path / jsonl) as f:
        head, *records = [json.loads(line) for line in f]
    assert head["renamed"] == result.report.renamed
    after = {n.name: n for n in result.graph_def.node}
    renamed = [r for r in records if "node_after" in r]
    assert renamed
    for record in renamed:
        assert record["node"] in after  # kept for its readers: Casts, or a float32 Switch
        assert after[record["node_after"]].op == record["op"]


def test_a_graph_def_of_another_protobuf_runtime_is_rewritten_and_logged(
    tmp_path, tf1_graph  # noqa: ANN001
) -> None:
    # The rewrite accepted such a message by its bytes, then failed while logging it (the log
    # writer copied the caller's message), leaving a partial set of files.
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()

    def add(file_descriptor) -> None:  # noqa: ANN001
        for dependency in file_descriptor.dependencies:
            try:
                pool.FindFileByName(dependency.name)
            except KeyError:
                add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file_descriptor.CopyToProto(proto)
        pool.Add(proto)

    add(graph_pb2.DESCRIPTOR)
    foreign_class = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.GraphDef"))
    graph_def, fetches = tf1_graph.graph_def, tf1_graph.fetches
    foreign = foreign_class.FromString(graph_def.SerializeToString())
    assert not isinstance(foreign, graph_pb2.GraphDef)
    config = RewriteConfig(preserve_nodes=frozenset(fetches), log_dir=str(tmp_path))
    result = rewrite_graph_def(foreign, config)
    assert result.report.changed
    assert result.graph_def == rewrite_graph_def(graph_def, config.replace(log_dir=None)).graph_def
    assert len(glob.glob(str(tmp_path / "graphdef_preop_*.pb"))) == 1


def test_control_inputs_are_never_rewired() -> None:
    # x ─ MatMul(^c first, unusual but seen in hand-made graphs)  casts replace data inputs only
    gd = build(mlp)
    mm = node(gd, "mm")
    data = list(mm.input)
    del mm.input[:]
    mm.input.extend(["^w", *data])
    out = rewrite_graph_def(gd, RewriteConfig(fold_constant_casts=False)).graph_def
    assert list(node(out, "mm").input) == ["^w", "x-0-CastToFp16-tf_amp", "w-0-CastToFp16-tf_amp"]


def test_name_preserving_mode_on_a_training_graph_with_a_v1_loop(tf1_graph) -> None:  # noqa: ANN001
    # what the TF1 Session adapter runs: every original tensor name keeps its dtype, the graph
    # (loop, optimizer, initializers) still trains
    cfg = RewriteConfig(preserve_names=True, preserve_nodes=frozenset(tf1_graph.fetches))
    result = rewrite_graph_def(tf1_graph.graph_def, cfg)
    assert "while/MatMul" in result.report.renamed
    before, after = tf.Graph(), tf.Graph()
    with before.as_default():
        tf.graph_util.import_graph_def(tf1_graph.graph_def, name="")
    with after.as_default():
        tf.graph_util.import_graph_def(result.graph_def, name="")
    for op in before.get_operations():
        new_op = after.get_operation_by_name(op.name)
        assert [t.dtype for t in new_op.outputs] == [t.dtype for t in op.outputs], op.name
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(8, 16)
    want = run(tf1_graph.graph_def, ["loss:0", "train"], {"x": x}, init="init")[0]
    got = run(result.graph_def, ["loss:0", "train"], {"x": x}, init="init")[0]
    np.testing.assert_allclose(got, want, rtol=2e-2)


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_node_order_changes_no_edge_and_no_colour(tf1_graph, order: str) -> None:  # noqa: ANN001
    # The view resolves an input by comparing it with the names of the one or two nodes
    # written just before its consumer, and only then probes the name index. In any node
    # order (the first node reading the last one included) every edge must name the same
    # source, and the painting must be the same.
    from tf_amp.type_attrs import build_body_view

    gd = tf1_graph.graph_def
    nodes = list(gd.node)
    if order == "reversed":
        nodes.reverse()
    else:
        np.random.default_rng(0).shuffle(nodes)
    # The first node reads the last one: a consumer moves to the front, its producer to the
    # end (for the first node, "the node before" is the last one by Python's index -1).
    by_name = {n.name: n for n in nodes}
    consumer = next(n for n in nodes if n.input and n.input[0] in by_name)
    producer = by_name[consumer.input[0]]
    nodes = [consumer, *(n for n in nodes if n is not consumer and n is not producer), producer]
    reordered = graph_pb2.GraphDef()
    reordered.CopyFrom(gd)
    del reordered.node[:]
    reordered.node.extend(nodes)

    view = build_body_view(reordered.node, {})
    for k in range(len(view.e_src)):
        text = reordered.node[view.e_dst[k]].input[view.e_pos[k]]
        name, _, port = text.rpartition(":") if ":" in text else (text, "", "0")
        assert view.names[view.e_src[k]] == name and view.e_sport[k] == int(port)
    config = RewriteConfig(preserve_nodes=frozenset(tf1_graph.fetches))
    expected = rewrite_graph_def(gd, config).report.colours()
    assert rewrite_graph_def(reordered, config).report.colours() == expected


def test_one_node_graph_with_a_dangling_input_is_a_clear_error() -> None:
    # A single node has no two predecessors to compare its input with: the general path
    # must still name the problem (not fail on an index).
    gd = graph_pb2.GraphDef()
    lone = gd.node.add(name="relu", op="Relu")
    lone.attr["T"].type = FLOAT
    lone.input.append("missing")
    with pytest.raises(GraphRewriteError, match="names no node"):
        rewrite_graph_def(gd)
