"""Excluding a region keeps its backward pass float32 too, not only its forward ops.

    x ─► [keep_fp32/kept MatMul] ─► h ─► [converted MatMul] ─► loss
    backward: gradient_tape/keep_fp32/kept/...  (float32, like its forward op)
              gradient_tape/converted/...        (float16)
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tf_amp
from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def


def _matmul_dtypes(graph_def) -> dict[str, str]:
    return {n.name: tf.dtypes.as_dtype(n.attr["T"].type).name
            for n in graph_def.node if n.op == "MatMul"}


def _tape_step_graph(region):
    w, v = tf.Variable(tf.ones([4, 4])), tf.Variable(tf.ones([4, 4]))

    def step(x):
        with tf.GradientTape() as tape:
            with region():
                h = tf.matmul(x, w, name="kept")
            loss = tf.reduce_sum(tf.matmul(h, v, name="converted"))
        return tape.gradient(loss, [w, v])

    return tf.function(step).get_concrete_function(tf.TensorSpec([4, 4])).graph.as_graph_def()


def _assert_region_float32_everywhere(dtypes: dict[str, str]) -> None:
    kept = {name: dt for name, dt in dtypes.items() if "kept" in name}
    converted = {name: dt for name, dt in dtypes.items() if "converted" in name}
    assert any(name.startswith("gradient_tape/") for name in kept), dtypes  # backward exists
    assert set(kept.values()) == {"float32"}, dtypes
    assert set(converted.values()) == {"float16"}, dtypes


def test_excluded_name_scope_keeps_its_gradient_ops_float32():
    graph_def = _tape_step_graph(lambda: tf.name_scope("keep_fp32"))
    result = rewrite_graph_def(graph_def, RewriteConfig(exclude_scopes=("keep_fp32",)))
    _assert_region_float32_everywhere(_matmul_dtypes(result.graph_def))


def test_keep_float32_attribute_region_keeps_its_gradient_ops_float32():
    graph_def = _tape_step_graph(tf_amp.keep_float32)
    _assert_region_float32_everywhere(_matmul_dtypes(rewrite_graph_def(graph_def).graph_def))


def test_tf1_gradients_of_an_excluded_scope_stay_float32():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 4], use_resource=True)
        with tf.name_scope("keep_fp32"):
            h = tf.matmul(x, w, name="kept")
        loss = tf.reduce_sum(tf.matmul(h, h, name="converted"))
        tf.compat.v1.gradients(loss, [w])
    result = rewrite_graph_def(graph.as_graph_def(),
                               RewriteConfig(exclude_scopes=("keep_fp32",)))
    dtypes = _matmul_dtypes(result.graph_def)
    kept_grads = {n: d for n, d in dtypes.items() if n.startswith("gradients/keep_fp32/")}
    assert kept_grads and set(kept_grads.values()) == {"float32"}, dtypes
    assert dtypes["converted"] == "float16"


# Values that overflow float16 (max 65504): x @ W is 9600 a element, times W again 3.1e6.
_W = tf.fill([8, 8], 40.0)
_X = tf.fill([4, 8], 30.0)


@tf.function
def _inner_matmuls(a: tf.Tensor) -> tf.Tensor:
    return tf.matmul(tf.matmul(a, _W), _W) / 1e4


def _in_a_while_body(a: tf.Tensor) -> tf.Tensor:
    with tf_amp.keep_float32():
        return tf.while_loop(lambda i, t: i < 1,
                             lambda i, t: (i + 1, tf.matmul(tf.matmul(t, _W), _W) / 1e4),
                             (0, a))[1]


def _in_a_cond_branch(a: tf.Tensor) -> tf.Tensor:
    with tf_amp.keep_float32():
        return tf.cond(tf.reduce_sum(a) > 0, lambda: _inner_matmuls.python_function(a),
                       lambda: a)


def _in_a_nested_function(a: tf.Tensor) -> tf.Tensor:
    with tf_amp.keep_float32():
        return _inner_matmuls(a)


def test_keep_float32_covers_loop_bodies_branches_and_nested_functions():
    """The block marks the ops built in its own graph; a loop body, a branch or a nested
    tf.function is traced into a graph of its own, and was painted half: inf where the
    user kept float32 (the values exceed float16's range)."""
    for body in (_in_a_while_body, _in_a_cond_branch, _in_a_nested_function):
        expected = tf.function(body)(_X)
        got = tf_amp.function(body, config=RewriteConfig(target_dtype="float16"))(_X)
        np.testing.assert_array_equal(got, expected, err_msg=body.__name__)
        assert abs(float(got[0, 0]) - 307.2) < 1e-3


def test_an_excluded_scope_covers_the_functions_it_calls():
    """``exclude_scopes`` names nodes by scope, and a library function's nodes carry no
    scope: a tf.function called in the scope stayed in the library (a SavedModel given to
    ``tf-amp rewrite``) and was painted half."""

    def scoped(a: tf.Tensor) -> tf.Tensor:
        with tf.name_scope("head"):
            kept = _inner_matmuls(a)
        return kept + _inner_matmuls.python_function(a)  # the same ops outside the scope

    graph_def = tf.function(scoped).get_concrete_function(_X).graph.as_graph_def()
    config = RewriteConfig(target_dtype="float16", exclude_scopes=("head",))
    out = rewrite_graph_def(graph_def, config).graph_def
    assert set(_matmul_dtypes(out).values()) == {"float16"}  # outside the scope: converted
    for function in out.library.function:
        assert {n.attr["T"].type for n in function.node_def if n.op == "MatMul"} == {
            tf.float32.as_datatype_enum
        }


def test_the_tapes_gradient_of_an_excluded_function_call_stays_float32():
    """A tape differentiates a call with a call of its own, of a backward function (a plain
    "PartitionedCall", named after nothing excluded): its MatMuls ran half where the user
    kept the region float32, inlined or (jit_compile) left in the library."""
    w = tf.Variable(tf.random.stateless_normal([16, 16], seed=(1, 2)) * 0.3)
    x = tf.random.stateless_normal([8, 16], seed=(3, 4))
    for jit_compile in (False, True):
        head = tf.function(lambda a: tf.matmul(a, w), jit_compile=jit_compile)
        regions = {"keep_float32": (tf_amp.keep_float32, ()),
                   "scope": (lambda: tf.name_scope("head"), ("head",))}
        for kind, (region, scopes) in regions.items():
            def step(a: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                with tf.GradientTape() as tape:
                    with region():  # noqa: B023 - called at once, in this iteration
                        y = head(a)  # noqa: B023
                    loss = tf.reduce_sum(y * y)
                return loss, tape.gradient(loss, w)

            config = RewriteConfig(target_dtype="float16", exclude_scopes=scopes)
            _, want = tf.function(step)(x)
            _, got = tf_amp.function(step, config=config)(x)
            np.testing.assert_array_equal(got, want, err_msg=f"{kind}, jit {jit_compile}")


def test_the_gradient_loops_and_branches_of_an_excluded_region_stay_float32():
    """Two layouts whose backward pass escaped the exclusion (gradient off by 2e-3):
    - a cond kept float32 inside a loop body: its gradient is an If of the loop's gradient
      body, named after nothing excluded; its branches are found by the forward branches'
      names ("<branch>_grad_<uid>");
    - a Keras GRU kept float32 in a step that also calls a nested tf.function: inlining
      lowers the gradient loop to Enter / Merge / Switch nodes, which carry no mark."""
    import keras

    keras.utils.set_random_seed(0)
    w = tf.Variable(tf.random.stateless_normal([8, 8], seed=(1, 2)) * 0.3)
    x = tf.random.stateless_normal([4, 8], seed=(3, 4))
    sequences = tf.random.stateless_normal([4, 7, 5], seed=(5, 6))
    gru = keras.layers.GRU(6, return_sequences=True)
    gru(sequences)
    identity = tf.function(tf.identity)

    def cond_in_a_loop() -> tuple[tf.Tensor, list[tf.Tensor]]:
        def body(i: tf.Tensor, h: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            with tf_amp.keep_float32():
                h = tf.cond(i % 2 == 0, lambda: tf.tanh(tf.matmul(h, w)),
                            lambda: tf.matmul(h, w))
            return i + 1, h

        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.while_loop(lambda i, h: i < 4, body, (0, x))[1] ** 2)
        return loss, tape.gradient(loss, [w])

    def gru_with_a_nested_call() -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape, tf_amp.keep_float32():
            loss = tf.reduce_sum(identity(gru(sequences)) ** 2)
        return loss, tape.gradient(loss, gru.trainable_variables)

    for step in (cond_in_a_loop, gru_with_a_nested_call):
        want = tf.function(step)()
        amp = tf_amp.function(step, config=RewriteConfig(target_dtype="float16"))
        got = amp()
        np.testing.assert_array_equal(got[0], want[0], err_msg=step.__name__)
        for g, expected in zip(got[1], want[1], strict=True):
            np.testing.assert_array_equal(g, expected, err_msg=step.__name__)


def test_a_step_kept_float32_throughout_reports_nothing_converted():
    """The loop's gradient replaces the forward While body by a "<body>_rewritten" copy; the
    original stayed in the library, called by nothing, and was painted and counted: the
    report said it converted nodes of a step that runs float32 throughout."""
    import keras

    keras.utils.set_random_seed(0)
    sequences = tf.random.stateless_normal([4, 7, 5], seed=(5, 6))
    lstm = keras.layers.LSTM(6)
    lstm(sequences)

    def step() -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape, tf_amp.keep_float32():
            loss = tf.reduce_sum(lstm(sequences) ** 2)
        return loss, tape.gradient(loss, lstm.trainable_variables)

    amp = tf_amp.function(step, config=RewriteConfig(target_dtype="float16"))
    amp()
    report = amp.reports[-1]
    assert report.type_attrs_converted == 0 and report.nothing_to_do
