"""tf_amp.Session: a TF1 graph trains in float16 wherever a tf.compat.v1.Session would go.

Evidence that float16 ran: the partition graphs in RunMetadata (what the session executed)
hold float16 Conv2D / MatMul kernels. Fetches keep their dtypes; Saver checkpoints are
interchangeable with a plain float32 Session.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import attrs
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.client import session as session_lib

import tf_amp
from tests.e2e_helpers import executed_half_ops

tf1 = tf.compat.v1

Net = collections.namedtuple("Net", "graph x y logits loss train_op global_step saver init")


def _net(loss_scaled: bool = True) -> Net:
    """conv -> relu -> dense, softmax cross-entropy, SGD (loss-scaled), Saver."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        x = tf1.placeholder(tf.float32, [None, 8, 8, 1], name="x")
        y = tf1.placeholder(tf.int32, [None], name="y")
        kernel = tf1.get_variable("conv/kernel", [3, 3, 1, 8])
        hidden = tf.nn.relu(tf.nn.conv2d(x, kernel, 1, "SAME"))
        dense = tf1.get_variable("dense/kernel", [8 * 8 * 8, 10])
        logits = tf.matmul(tf.reshape(hidden, [-1, 8 * 8 * 8]), dense, name="logits")
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss"
        )
        step = tf1.train.get_or_create_global_step()
        opt: tf1.train.Optimizer = tf1.train.GradientDescentOptimizer(0.5)
        if loss_scaled:
            opt = tf_amp.LossScaleOptimizer(opt)
        train_op = opt.minimize(loss, global_step=step)
        saver = tf1.train.Saver()
        init = tf1.global_variables_initializer()
    return Net(graph, x, y, logits, loss, train_op, step, saver, init)


def _data(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    x = rng.random((n, 8, 8, 1), dtype=np.float32)
    return x, x.reshape(n, -1)[:, :10].argmax(axis=1).astype(np.int32)


def test_session_trains_in_half_and_fetches_keep_their_dtypes() -> None:
    net = _net()
    xs, ys = _data()
    feed = {net.x: xs, net.y: ys}
    with tf_amp.Session(graph=net.graph) as sess:
        assert sess.graph is net.graph and isinstance(sess, tf1.Session)
        sess.run(net.init)
        first = sess.run(net.loss, feed)
        options = tf1.RunOptions(output_partition_graphs=True)
        metadata = tf1.RunMetadata()
        sess.run(net.train_op, feed, options=options, run_metadata=metadata)
        for _ in range(30):
            sess.run(net.train_op, feed)
        last, logits, step = sess.run([net.loss, net.logits, net.global_step], feed)
        # Tensor.eval / Operation.run use the default session: ours.
        assert net.loss.eval(feed) == pytest.approx(last, rel=1e-3)

    # (no Conv2DBackpropInput: the first layer's input needs no gradient)
    assert {"Conv2D", "Conv2DBackpropFilter", "MatMul"} <= executed_half_ops(metadata)
    assert last < 0.8 * first
    assert step == 31
    assert logits.dtype == np.float32 and np.asarray(last).dtype == np.float32


def test_nested_fetches_names_and_callables() -> None:
    net = _net()
    xs, ys = _data()
    Pair = collections.namedtuple("Pair", "loss logits")
    with tf_amp.Session(graph=net.graph) as sess:
        sess.run(net.init)
        out = sess.run(
            {"pair": Pair(net.loss, "logits:0"), "list": [net.global_step, (net.loss,)]},
            {"x:0": xs, net.y: ys},
        )
        assert isinstance(out["pair"], Pair) and out["pair"].logits.shape == (64, 10)
        assert out["list"][0] == 0 and out["list"][1][0] == pytest.approx(out["pair"].loss)
        run_step = sess.make_callable([net.train_op, net.loss], feed_list=[net.x, net.y])
        losses = [run_step(xs, ys)[1] for _ in range(10)]
        assert losses[-1] < losses[0]


@contextlib.contextmanager
def _session_after_one_step() -> Iterator[tuple[Net, tf_amp.Session, np.ndarray, np.ndarray]]:
    """A tf_amp.Session that has initialised the net and run one train step."""
    net = _net()
    xs, ys = _data()
    with tf_amp.Session(graph=net.graph) as sess:
        sess.run(net.init)
        sess.run(net.train_op, {net.x: xs, net.y: ys})
        yield net, sess, xs, ys


def test_ops_added_after_creation_are_rewritten_and_run() -> None:
    with _session_after_one_step() as (net, sess, xs, _):
        with net.graph.as_default():
            w = tf1.get_variable("late/kernel", [10, 4], initializer=tf1.ones_initializer())
            late = tf.matmul(net.logits, w, name="late_matmul")
            late_init = tf1.variables_initializer([w])
        sess.run(late_init)
        got = sess.run(late, {net.x: xs})
        expected = sess.run(net.logits, {net.x: xs}) @ np.ones((10, 4), np.float32)
        late_node = sess.rewritten_graph.get_operation_by_name("late_matmul")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2)
    # name preserved: the original name is float32 (a Cast back if the MatMul went half)
    assert late_node.outputs[0].dtype == tf.float32


def test_ops_added_later_may_depend_on_ops_that_already_ran() -> None:
    """tf.group(train_op) or an initializer built after the first run: a control edge from a
    new op to an op already in the rewritten graph."""
    with _session_after_one_step() as (net, sess, xs, ys):
        with net.graph.as_default():
            step = tf.group(net.train_op, name="step")
            with tf.control_dependencies([net.train_op]):
                counted = tf.identity(net.global_step, name="counted")
        assert sess.run(step, {net.x: xs, net.y: ys}) is None
        assert int(sess.run(net.global_step)) == 2  # the grouped train_op ran
        assert int(sess.run(counted, {net.x: xs, net.y: ys})) == 3
        assert sess.rewritten_graph.get_operation_by_name("step").control_inputs


def test_ops_added_later_may_be_colocated_with_ops_that_already_ran(tmp_path) -> None:
    """An ExponentialMovingAverage, or a tf.compat.v1.train.Checkpoint (its save_counter is
    made on the first save), built after the first run: their ops are colocated with
    variables already imported, and the import refused them ("expects to be colocated with
    unknown node")."""
    with _session_after_one_step() as (net, sess, _, _):
        with net.graph.as_default():
            kernel = next(v for v in tf1.global_variables() if v.op.name == "dense/kernel")
            ema = tf1.train.ExponentialMovingAverage(0.5)
            update = ema.apply([kernel])
            average = ema.average(kernel)
            checkpoint = tf1.train.Checkpoint(step=net.global_step)
            sess.run(tf1.variables_initializer([average]))
            sess.run(update)
            path = checkpoint.save(str(tmp_path / "ckpt"), session=sess)
        np.testing.assert_array_equal(sess.run(average), sess.run(kernel))
        colocated = sess.rewritten_graph.get_operation_by_name(average.op.name)
        assert colocated.colocation_groups() == average.op.colocation_groups()
    assert tf.train.load_checkpoint(path).get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 1


def test_composite_and_dict_like_fetches_and_feeds_match_a_plain_session() -> None:
    """A RaggedTensor fetch came back as its flat values alone (its graph element), silently
    losing the rows; IndexedSlices (the gradient of a gather), a ragged placeholder's feed
    and a defaultdict of fetches raised TypeErrors."""
    graph = tf.Graph()
    with graph.as_default():
        table = tf1.get_variable("table", [5, 4], initializer=tf1.ones_initializer())
        rows = tf.gather(table, [0, 2, 2])
        slices = tf.gradients(tf.reduce_sum(tf.matmul(rows, tf.ones([4, 4]))), [table])[0]
        ragged = tf.RaggedTensor.from_row_lengths(tf.range(5.0), [2, 3])
        fed = tf1.ragged.placeholder(tf.float32, 1, [])
        sums = tf.reduce_sum(fed, axis=1)
        init = tf1.global_variables_initializer()
    fetches = collections.defaultdict(list, {"slices": slices, "ragged": ragged})
    feed = {fed: tf1.ragged.RaggedTensorValue(np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32),
                                              np.array([0, 2, 5], np.int64))}
    results = []
    for session_class in (tf1.Session, tf_amp.Session):
        with session_class(graph=graph) as sess:
            sess.run(init)
            results.append((sess.run(fetches), sess.run(sums, feed)))
    (plain, plain_sums), (ours, our_sums) = results
    assert type(ours) is collections.defaultdict and ours.default_factory is list
    assert type(ours["ragged"]) is type(plain["ragged"])
    assert ours["ragged"].to_list() == plain["ragged"].to_list() == [[0.0, 1.0], [2.0, 3.0, 4.0]]
    np.testing.assert_array_equal(ours["slices"].values, plain["slices"].values)
    np.testing.assert_array_equal(ours["slices"].indices, plain["slices"].indices)
    np.testing.assert_array_equal(our_sums, plain_sums)


@attrs.define
class _Pair:
    first: object
    second: object


class _Scaled:
    """A script's own type, fetched and fed through ``register_session_run_conversion_functions``:
    fetched as its tensor's value times ``factor``, fed by feeding that tensor."""

    def __init__(self, tensor: tf.Tensor, factor: float) -> None:
        self.tensor, self.factor = tensor, factor


session_lib.register_session_run_conversion_functions(
    _Scaled,
    lambda s: ([s.tensor], lambda values: values[0] * s.factor),
    lambda s, value: [(s.tensor, value)],
)


def test_attrs_and_registered_type_fetches_and_feeds_match_a_plain_session() -> None:
    """``Session.run`` takes attrs classes and types registered with
    ``register_session_run_conversion_functions``; tf_amp's raised "cannot fetch or feed"."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 2])
        w = tf.constant([[1.0, 2.0], [3.0, 4.0]])
        y = tf.matmul(x, w)
        fetches = _Pair(first=y, second=_Scaled(y, 10.0))
    feed = {_Scaled(x, 0.0): np.eye(2, dtype=np.float32)}
    results = []
    for session_class in (tf1.Session, tf_amp.Session):
        with session_class(graph=graph) as sess:
            results.append(sess.run(fetches, feed))
    plain, ours = results
    assert type(ours) is _Pair and type(ours.second) is type(plain.second)
    np.testing.assert_array_equal(plain.first, [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_allclose(ours.first, plain.first, rtol=1e-3)
    np.testing.assert_allclose(ours.second, plain.second, rtol=1e-3)
    np.testing.assert_array_equal(plain.second, 10 * plain.first)


def test_saver_checkpoints_are_interchangeable_with_float32_sessions(tmp_path) -> None:
    net = _net()
    xs, ys = _data()
    feed = {net.x: xs, net.y: ys}
    with tf_amp.Session(graph=net.graph) as sess:
        sess.run(net.init)
        for _ in range(5):
            sess.run(net.train_op, feed)
        path = net.saver.save(sess, str(tmp_path / "amp"), global_step=net.global_step)
        amp_logits = sess.run(net.logits, feed)

    with tf1.Session(graph=net.graph) as plain:  # float32 session restores the AMP checkpoint
        net.saver.restore(plain, path)
        assert plain.run(net.global_step) == 5
        fp32_logits = plain.run(net.logits, feed)
        for _ in range(3):
            plain.run(net.train_op, feed)
        path = net.saver.save(plain, str(tmp_path / "fp32"), global_step=net.global_step)
    np.testing.assert_allclose(amp_logits, fp32_logits, rtol=2e-2, atol=2e-2)

    with tf_amp.Session(graph=net.graph) as sess:  # and the AMP session resumes float32's
        net.saver.restore(sess, path)
        assert sess.run(net.global_step) == 8
        sess.run(net.train_op, feed)
        assert sess.run(net.global_step) == 9


def test_graph_without_convertible_ops_runs_unchanged() -> None:
    graph = tf.Graph()
    with graph.as_default():
        a = tf1.placeholder(tf.float32, [3], name="a")
        total = tf.reduce_sum(a * 2.0)
    with tf_amp.Session(graph=graph) as sess:
        assert sess.run(total, {a: [1.0, 2.0, 3.0]}) == 12.0
        assert not sess.rewrite_reports[0].changed


def test_interactive_session_evals_through_the_rewritten_graph() -> None:
    """tf_amp's InteractiveSession is the default session: Tensor.eval / Operation.run train
    in float16, and close() uninstalls it like TensorFlow's."""
    from tf_amp.runtime.session import InteractiveSession

    net = _net()
    xs, ys = _data()
    feed = {net.x: xs, net.y: ys}
    sess = InteractiveSession(graph=net.graph)
    try:
        assert isinstance(sess, tf1.InteractiveSession)
        assert tf1.get_default_session() is sess
        net.init.run()
        first = net.loss.eval(feed)
        for _ in range(20):
            net.train_op.run(feed)
        metadata = tf1.RunMetadata()
        options = tf1.RunOptions(output_partition_graphs=True)
        sess.run(net.train_op, feed, options=options, run_metadata=metadata)
        assert {"Conv2D", "MatMul"} <= executed_half_ops(metadata)
        assert net.loss.eval(feed) < first
        assert net.logits.eval(feed).dtype == np.float32
    finally:
        sess.close()
    assert tf1.get_default_session() is None


def test_feeding_an_intermediate_tensor_reaches_its_half_consumers() -> None:
    """A fed tensor whose op went half (moved to a new name, the old name a Cast back) must
    reach the half consumers too, as tf.compat.v1.Session does: they read the fed value."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.constant(np.full((4, 4), 0.5, np.float32))
        a = tf.matmul(x, w)
        b = tf.identity(a, name="b")
        c = tf.matmul(b, w, name="c")
        d = b + 1.0
    xs = np.ones((4, 4), np.float32)
    fed = np.arange(16, dtype=np.float32).reshape(4, 4) / 8.0
    with tf1.Session(graph=graph) as plain:
        want = plain.run([c, d], {x: xs, b: fed})
    with tf_amp.Session(graph=graph) as sess:
        got = sess.run([c, d], {x: xs, b: fed})
        assert sess.rewrite_reports[0].renamed.get("b")  # b really went half
        got_by_name = sess.run("c:0", {"x:0": xs, "b:0": fed})
        run_c = sess.make_callable(c, feed_list=[x, b])
        got_callable = run_c(xs, np.zeros((4, 4), np.float32))
    for have, expected in zip(got, want, strict=True):
        np.testing.assert_allclose(have, expected, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(got_by_name, want[0], rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(got_callable, np.zeros((4, 4), np.float32))


def test_feeding_a_float_port_of_a_moved_node_reaches_its_half_consumers() -> None:
    # FusedBatchNormV3 moves (its port 0 goes half) while its batch mean, port 1, stays
    # float32: a half consumer's Cast read the moved node itself and ignored the feed.
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 4, 4, 4], name="x")
        kernel = tf.constant(np.random.RandomState(1).randn(1, 1, 4, 4).astype(np.float32))
        conv = tf.nn.conv2d(x, kernel, 1, "SAME")
        _, mean, _ = tf1.nn.fused_batch_norm(conv, tf.ones([4]), tf.zeros([4]),
                                             is_training=True, name="bn")
        w = tf.constant(np.random.RandomState(2).randn(4, 3).astype(np.float32))
        z = tf.matmul(tf.reshape(mean, [1, 4]), w, name="z")  # a half consumer of port 1
        s = tf.reduce_sum(mean, name="s")  # a float32 consumer of port 1
    feeds = {x: np.random.RandomState(0).randn(2, 4, 4, 4).astype(np.float32),
             mean: np.array([10.0, 20.0, 30.0, 40.0], np.float32)}
    with tf1.Session(graph=graph) as plain:
        want = plain.run([z, s], feeds)
    with tf_amp.Session(graph=graph) as sess:
        got = sess.run([z, s], feeds)
        assert sess.rewrite_reports[0].renamed.get("bn")  # bn really moved
    np.testing.assert_allclose(got[0], want[0], rtol=1e-2)
    assert got[1] == want[1]


def test_a_tensor_or_op_of_another_graph_is_refused_as_a_plain_session_does() -> None:
    # Looked up by name, another graph's "a:0" ran this graph's namesake, silently.
    mine, other = tf.Graph(), tf.Graph()
    with mine.as_default():
        x = tf1.placeholder(tf.float32, [2], name="x")
        tf.identity(x * 2.0, name="a")
    with other.as_default():
        other_x = tf1.placeholder(tf.float32, [2], name="x")
        other_a = tf.identity(tf.constant([10.0, 20.0]), name="a")
    with tf_amp.Session(graph=mine) as sess:
        with pytest.raises(ValueError, match="not an element of this session's graph"):
            sess.run(other_a, {"x:0": [1.0, 2.0]})
        with pytest.raises(ValueError, match="not an element of this session's graph"):
            sess.run([other_a.op])
        with pytest.raises(TypeError, match="Cannot interpret feed_dict key"):
            sess.run("a:0", {other_x: [1.0, 2.0]})
        np.testing.assert_array_equal(sess.run("a:0", {"x:0": [1.0, 2.0]}), [2.0, 4.0])


def test_a_fed_constant_beyond_the_half_range_reaches_its_half_readers() -> None:
    # A clipped half copy of the Const (read by float32 and half ops) was not fed: the half
    # MatMul used the constant's value where a plain Session uses the feed.
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [2, 2], name="x")
        c = tf.constant([[1e5, 1.0], [2.0, 3.0]], name="c")
        y = tf.matmul(x, c, name="y")
        z = tf.reduce_sum(tf.math.log(c), name="z")  # a float32 reader
    feeds = {x: np.eye(2, dtype=np.float32), c: np.ones((2, 2), np.float32)}
    with tf1.Session(graph=graph) as plain:
        want = plain.run([y, z], feeds)
    with tf_amp.Session(graph=graph) as sess:
        got = sess.run([y, z], feeds)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]


@pytest.mark.parametrize("in_a_loop", [False, True], ids=["straight", "while_loop"])
def test_a_reference_variable_read_after_its_assign_sees_the_new_value(in_a_loop: bool) -> None:
    """A TF1 reference variable's read aliases its buffer: a MatMul under
    ``control_dependencies([assign])`` reads it after the assign. The Cast the rewrite put in
    between copied it whenever it ran: the half MatMul read the old value in 109 of 200 runs
    (float32 Session: none), and in every iteration of a loop that assigns then reads."""
    from _model_graphs import v1_control_flow

    graph = tf.Graph()
    with graph.as_default(), v1_control_flow():  # a v2 loop captures a reference by value
        x = tf1.placeholder(tf.float32, [1, 4])
        w = tf1.Variable(tf.eye(4), name="w", use_resource=False)
        if in_a_loop:

            def body(i, total):
                with tf.control_dependencies([tf1.assign_add(w, tf.eye(4))]):
                    y = tf.matmul(x, tf.identity(w))
                return i + 1, total + y[0, 0]

            fetch = tf1.while_loop(lambda i, _: i < 3, body, [0, 0.0], parallel_iterations=1)[1]
        else:
            with tf.control_dependencies([tf1.assign_add(w, tf.eye(4))]):
                fetch = tf.matmul(x, w)[0, 0]
        init = tf1.global_variables_initializer()
    feed = {x: np.ones([1, 4], np.float32)}
    results = {}
    for name, session in (("float32", tf1.Session(graph=graph)),
                          ("tf_amp", tf_amp.Session(graph=graph))):
        with session:
            session.run(init)
            results[name] = [float(session.run(fetch, feed)) for _ in range(40)]
    assert results["tf_amp"] == results["float32"]
