"""Gathers and slices of a float32 weight table run in float32: the Cast is of the rows they
select, not of the whole table every step (``tf_amp.painter.table_selection``).

The graphs are real TensorFlow graphs with resource and TF1 variables, rewritten and run in a
Session; the Keras test runs an ``Embedding`` model's train step through ``tf_amp.function``.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import tf_amp
from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def

TARGETS = {"float16": tf.float16, "bfloat16": tf.bfloat16}
TOKENS = np.random.default_rng(1).integers(0, 8, (4, 6)).astype(np.int32)


def _lookup_graph(
    vocab: int = 64, tied: bool = False, resource: bool = True, select: str = "gather",
    add_shapes: bool = False,
) -> graph_pb2.GraphDef:
    """tokens -> rows of ``table`` (gather, or a slice) -> MatMul -> ``out``; ``tied``: the
    same read of the table also feeds an output projection (a tied embedding)."""
    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        tokens = tf.compat.v1.placeholder(tf.int32, [4, 6], name="tokens")
        initial = rng.standard_normal((vocab, 16)).astype(np.float32)
        if resource:
            table = tf.Variable(initial, name="table")
            read = table.value()  # a ReadVariableOp
        else:
            read = tf.compat.v1.Variable(initial, name="table", use_resource=False)
        w = tf.Variable(rng.standard_normal((16, 8)).astype(np.float32), name="w")
        if select == "gather":
            rows = tf.reshape(tf.gather(read, tokens, name="lookup"), [-1, 16])
        else:  # the first rows, as a position embedding reads them
            rows = tf.slice(read, [0, 0], [24, 16], name="lookup")
        logits = tf.matmul(rows, w.value(), name="logits")
        if tied:
            logits = tf.concat([logits, tf.matmul(rows, read, transpose_b=True)], 1)
        tf.identity(logits, name="out")
        tf.compat.v1.global_variables_initializer()  # "init"
    return graph.as_graph_def(add_shapes=add_shapes)


def _rewrite(graph_def: graph_pb2.GraphDef, target: str, **changes: object) -> graph_pb2.GraphDef:
    config = RewriteConfig(target_dtype=target, preserve_nodes=frozenset({"out"}), **changes)
    return rewrite_graph_def(graph_def, config).graph_def


def _node(graph_def: graph_pb2.GraphDef, name: str) -> object:
    return next(n for n in graph_def.node if n.name == name)


def _casts_reading(graph_def: graph_pb2.GraphDef, name: str) -> list[object]:
    return [n for n in graph_def.node if n.op == "Cast" and n.input[0].split(":")[0] == name]


def _run(graph_def: graph_pb2.GraphDef) -> np.ndarray:
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        session.run("init")
        return session.run("out:0", {"tokens:0": TOKENS})


def _table_read(graph_def: graph_pb2.GraphDef) -> str:
    """The node whose output is the table's value: the ReadVariableOp, or TF1's ``read``."""
    return _node(graph_def, "lookup").input[0].split(":")[0]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("resource", [True, False], ids=["resource", "tf1-ref"])
def test_lookup_runs_in_float32_and_only_its_rows_are_cast(target: str, resource: bool) -> None:
    before = _lookup_graph(resource=resource)
    ours = _rewrite(before, target)
    lookup = _node(ours, "lookup")
    assert lookup.attr["Tparams"].type == tf.float32.as_datatype_enum
    assert _casts_reading(ours, _table_read(before)) == []
    (cast,) = _casts_reading(ours, "lookup")
    assert cast.attr["DstT"].type == TARGETS[target].as_datatype_enum
    assert _node(ours, "logits").attr["T"].type == TARGETS[target].as_datatype_enum
    # Casting the rows instead of the table gives the same bits.
    tables_cast = _rewrite(before, target, select_before_cast=False)
    assert _node(tables_cast, "lookup").attr["Tparams"].type == TARGETS[target].as_datatype_enum
    assert len(_casts_reading(tables_cast, _table_read(before))) == 1
    np.testing.assert_array_equal(_run(ours), _run(tables_cast))


@pytest.mark.parametrize("target", TARGETS)
def test_slice_of_a_table_runs_in_float32(target: str) -> None:
    before = _lookup_graph(select="slice")
    ours = _rewrite(before, target)
    assert _node(ours, "lookup").attr["T"].type == tf.float32.as_datatype_enum
    assert _casts_reading(ours, _table_read(before)) == []
    assert len(_casts_reading(ours, "lookup")) == 1
    np.testing.assert_array_equal(
        _run(ours), _run(_rewrite(before, target, select_before_cast=False)))


def test_a_tied_table_shares_its_cast_with_the_lookup() -> None:
    """The output projection needs the whole table in half anyway: the lookup reads that
    Cast, rather than adding a second one of its rows."""
    before = _lookup_graph(tied=True)
    ours = _rewrite(before, "bfloat16")
    assert _node(ours, "lookup").attr["Tparams"].type == tf.bfloat16.as_datatype_enum
    assert len(_casts_reading(ours, _table_read(before))) == 1
    assert _casts_reading(ours, "lookup") == []


@pytest.mark.parametrize(("vocab", "kept_float32"), [(64, True), (2, False)])
def test_recorded_shapes_decide_whether_the_rows_are_fewer(vocab: int, kept_float32: bool) -> None:
    """A two-row table looked up for 24 tokens selects more values than the table holds: the
    table's Cast is the cheaper one, and the GraphDef's shapes say so."""
    ours = _rewrite(_lookup_graph(vocab=vocab, add_shapes=True), "bfloat16")
    expected = tf.float32 if kept_float32 else tf.bfloat16
    assert _node(ours, "lookup").attr["Tparams"].type == expected.as_datatype_enum


def test_the_report_says_why_the_lookup_stays_float32() -> None:
    result = rewrite_graph_def(
        _lookup_graph(), RewriteConfig(target_dtype="bfloat16", preserve_nodes=frozenset({"out"})))
    decision = result.report.decision_for("lookup", "Tparams")
    assert decision.dtype == "float32"
    assert "weight table" in decision.reason and "not of the whole table" in decision.reason


def test_switch_env_and_levels() -> None:
    assert RewriteConfig().selects_before_cast
    assert not RewriteConfig(select_before_cast=False).selects_before_cast
    assert not RewriteConfig(opt_level="O3").selects_before_cast
    assert not RewriteConfig(level="UNSAFE_FORCE_ALL").selects_before_cast
    assert not RewriteConfig.from_env(
        {"TF_AMP_TARGET_DTYPE": "bfloat16", "TF_AMP_SELECT_BEFORE_CAST": "0"}
    ).selects_before_cast
    with pytest.raises(ValueError, match="TF_AMP_SELECT_BEFORE_CAST"):
        RewriteConfig.from_env({"TF_AMP_SELECT_BEFORE_CAST": "rows"})


def test_keras_embedding_step_casts_the_rows_it_gathers() -> None:
    """A Keras Embedding model's train step through ``tf_amp.function``: the executed graph
    gathers from the float32 table and casts the gathered rows to bfloat16."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6,), dtype="int32"),
        keras.layers.Embedding(500, 16),
        keras.layers.Flatten(),
        keras.layers.Dense(4),
    ])
    optimizer = keras.optimizers.SGD(0.1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf_amp.function(config=RewriteConfig(target_dtype="bfloat16"))
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    x, y = TOKENS, np.arange(4, dtype=np.int32)
    losses = [float(train_step(x, y)) for _ in range(20)]
    assert losses[-1] < losses[0]
    (concrete,) = train_step.rewritten_concrete_functions()
    nodes = list(concrete.graph.as_graph_def().node)
    for function in concrete.graph.as_graph_def().library.function:
        nodes.extend(function.node_def)
    gathers = [n for n in nodes if n.op == "GatherV2" and n.attr["Tparams"].type == 1]
    assert gathers, "the embedding's gather runs in float32"
    gathered = {n.name for n in gathers}
    row_casts = [n for n in nodes if n.op == "Cast" and n.input[0].split(":")[0] in gathered]
    assert row_casts and all(
        n.attr["DstT"].type == tf.bfloat16.as_datatype_enum for n in row_casts)
    assert "MatMul" in {n.op for n in nodes if n.attr["T"].type == tf.bfloat16.as_datatype_enum}
