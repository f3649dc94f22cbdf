"""tf_amp.function end to end: custom training loops run the float16 graph on the real variables.

Evidence that half precision really ran: (1) the graph the rewritten concrete function executes
holds float16 Conv2D / MatMul kernels, (2) its numbers differ from the float32 function by
float16 rounding (a few 1e-4 relative), not by zero and not by more.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tests.e2e_helpers import HEAVY_OPS, half_ops_of_functions
from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp.config import RewriteConfig
from tf_amp.runtime import activation
from tf_amp.runtime.function import AmpTfFunction, Function

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _cnn(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )


def _data(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((n, 8, 8, 1), dtype=np.float32)
    y = (x.reshape(n, -1)[:, :10].argmax(axis=1)).astype(np.int32)
    return x, y


def _amp_train_step(model: keras.Model, opt: keras.optimizers.Optimizer) -> Function:
    """The custom-loop step of the README: scaled loss, ``apply`` (unscale, check, update)."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf_amp.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = opt.scale_loss(loss)
        opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return loss

    return train_step


def test_custom_loop_trains_in_half_on_the_original_variables() -> None:
    model = _cnn()
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    train_step = _amp_train_step(model, opt)

    x, y = _data()
    before = [v.numpy().copy() for v in model.trainable_variables]
    losses = [float(train_step(x, y)) for _ in range(40)]

    assert half_ops_of_functions(train_step.rewritten_concrete_functions()) >= HEAVY_OPS
    assert losses[-1] < 0.8 * losses[0]
    assert int(opt.iterations) == 40
    assert all(
        not np.allclose(b, v.numpy())
        for b, v in zip(before, model.trainable_variables, strict=True)
    )
    assert len(train_step.rewritten_concrete_functions()) == 1  # cached per input signature
    assert train_step.reports and train_step.reports[0].type_attrs_converted > 0


def test_forward_differs_from_float32_by_half_rounding_only() -> None:
    model = _cnn()
    x, _ = _data()
    amp_out = tf_amp.function(lambda t: model(t))(x).numpy()
    fp32_out = tf.function(lambda t: model(t))(x).numpy()
    error = np.abs(amp_out - fp32_out).max() / np.abs(fp32_out).max()
    assert amp_out.dtype == np.float32  # outputs keep their dtype
    assert 1e-6 < error < 5e-3


def test_new_input_signature_gets_its_own_rewrite() -> None:
    model = _cnn()
    forward = tf_amp.function(lambda t: model(t))
    forward(np.zeros((4, 8, 8, 1), np.float32))
    forward(np.zeros((4, 8, 8, 1), np.float32))
    assert len(forward.rewritten_concrete_functions()) == 1
    forward(np.zeros((5, 8, 8, 1), np.float32))
    assert len(forward.rewritten_concrete_functions()) == 2


def test_jit_compile_runs_the_half_graph_under_xla() -> None:
    model = _cnn()
    x, _ = _data(16)
    forward = tf_amp.function(lambda t: model(t), jit_compile=True)
    out = forward(x).numpy()
    (concrete,) = forward.rewritten_concrete_functions()
    assert concrete.function_def.attr["_XlaMustCompile"].b
    assert "Conv2D" in half_ops_of_functions([concrete])
    np.testing.assert_allclose(out, model(x).numpy(), rtol=0, atol=5e-2)


def test_nested_functions_are_inlined_or_rewritten_in_the_library() -> None:
    w = tf.Variable(tf.random.stateless_normal((16, 16), seed=(1, 2)))

    @tf.function
    def inner(t: tf.Tensor) -> tf.Tensor:
        return tf.matmul(t, w)

    @tf.function(jit_compile=True)
    def compiled(t: tf.Tensor) -> tf.Tensor:  # jit_compile callees stay library functions
        return tf.matmul(t, w)

    @tf_amp.function
    def outer(t: tf.Tensor) -> tf.Tensor:
        return inner(t) + compiled(t)

    x = tf.random.stateless_normal((4, 16), seed=(3, 4))
    # Twice the same program: the second rebuild must not clash with the first's functions.
    again = tf_amp.function(outer.python_function)
    for fn in (outer, again):
        out = fn(x)
        np.testing.assert_allclose(out.numpy(), 2 * (x @ w).numpy(), rtol=2e-2, atol=2e-2)
    assert "MatMul" in half_ops_of_functions(outer.rewritten_concrete_functions())


def test_model_without_convertible_ops_runs_unchanged_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    v = tf.Variable([1.0, 2.0, 3.0])
    fn = tf_amp.function(lambda t: tf.reduce_sum(t * v) + 1.0)
    with caplog.at_level(logging.INFO, logger="tf_amp"):
        out = fn(tf.constant([1.0, 1.0, 1.0]))
    assert float(out) == 7.0
    lines = [r.getMessage() for r in caplog.records if r.name == "tf_amp"]
    assert len(lines) == 1 and "nothing to do" in lines[0]
    assert not half_ops_of_functions(fn.rewritten_concrete_functions())


def test_a_float32_target_is_said_once_and_reported_with_the_graphs_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing to rewrite still says what was chosen and why (once, for every trace), and
    the report counts the traced graph's nodes (it said "Converted 0/0")."""
    reason = "no reduced precision is fast here (this test's reason)"
    config = RewriteConfig(target_dtype="float32", target_reason=reason)
    w = tf.Variable(tf.ones((8, 8)))
    fn = tf_amp.function(lambda t: tf.matmul(t, w), config=config)
    with caplog.at_level(logging.INFO, logger="tf_amp"):
        fn(tf.ones((2, 8)))
        fn(tf.ones((3, 8)))  # a second trace
    said = [r.getMessage() for r in caplog.records if r.name == "tf_amp"]
    assert said == [f"target float32, without loss scaling: {reason}"]
    assert len(fn.reports) == 2 and fn.reports[0].nodes_before > 0
    assert fn.reports[0].summary_line() == (
        f"Converted 0/{fn.reports[0].nodes_before} nodes: target float32, graph left "
        f"unchanged ({reason})"
    )
    assert not half_ops_of_functions(fn.rewritten_concrete_functions())
    at_o0 = tf_amp.function(lambda t: tf.matmul(t, w), config=config.replace(opt_level="O0"))
    at_o0(tf.ones((2, 8)))
    assert at_o0.reports[0].summary_line().endswith("nodes: opt level O0, graph left unchanged")


def test_excluded_name_scope_stays_float32() -> None:
    w = tf.Variable(tf.ones((8, 8)))

    def two_matmuls(t: tf.Tensor) -> tf.Tensor:
        a = tf.matmul(t, w, name="converted")
        with tf.name_scope("keep_fp32"):
            b = tf.matmul(t, w, name="kept")
        return a + b

    fn = tf_amp.function(two_matmuls, config=RewriteConfig(exclude_scopes=("keep_fp32",)))
    fn(tf.ones((2, 8)))
    (concrete,) = fn.rewritten_concrete_functions()
    matmuls = {
        n.name.startswith("keep_fp32/"): n.attr["T"].type
        for n in concrete.graph.as_graph_def().node
        if n.op == "MatMul"
    }
    assert matmuls == {False: tf.float16.as_datatype_enum, True: tf.float32.as_datatype_enum}


def test_keep_float32_block_stays_float32() -> None:
    w = tf.Variable(tf.ones((8, 8)))

    @tf_amp.function
    def two_matmuls(t: tf.Tensor) -> tf.Tensor:
        a = tf.matmul(t, w, name="converted")
        with tf_amp.keep_float32():
            b = tf.matmul(t, w, name="kept")
        return a + b

    out = two_matmuls(tf.ones((2, 8)))
    (concrete,) = two_matmuls.rewritten_concrete_functions()
    matmuls = {
        n.attr["_tf_amp_exclude"].b: n.attr["T"].type
        for n in concrete.graph.as_graph_def().node
        if n.op == "MatMul"
    }
    assert matmuls == {False: tf.float16.as_datatype_enum, True: tf.float32.as_datatype_enum}
    np.testing.assert_allclose(out.numpy(), 16.0)


def _matmul_dtypes(graph_def: tf.compat.v1.GraphDef) -> set[tf.DType]:
    """The ``T`` of every MatMul in a graph and its function library."""
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return {tf.as_dtype(n.attr["T"].type) for n in nodes if n.op == "MatMul"}


class _Dense(tf.Module):
    def __init__(self) -> None:
        self.w = tf.Variable(tf.ones((4, 4)))

    @tf_amp.function
    def __call__(self, t: tf.Tensor) -> tf.Tensor:
        return tf.matmul(t, self.w)


def test_decorates_methods_with_one_cache_per_object() -> None:
    a, b = _Dense(), _Dense()
    b.w.assign(2 * tf.ones((4, 4)))
    assert float(tf.reduce_sum(a(tf.ones((1, 4))))) == 16.0
    assert float(tf.reduce_sum(b(tf.ones((1, 4))))) == 32.0
    assert "MatMul" in half_ops_of_functions(a.__call__.rewritten_concrete_functions())


def test_a_module_exports_its_rewritten_method_as_float32(tmp_path) -> None:
    """tf.saved_model.save exports only tf.function attributes; a tf_amp.function is one (it
    used to be left out of the SavedModel without a word). Export holds the float32 trace, as
    the environment's tf.function does: a rewrite is chosen for the hardware that runs it. The
    object in hand still runs, and returns, the rewritten function."""
    dense = _Dense()
    out = dense(tf.ones((2, 4)))
    assert isinstance(dense.__call__, tf.types.experimental.PolymorphicFunction)
    tf.saved_model.save(dense, str(tmp_path / "model"))

    loaded = tf.saved_model.load(str(tmp_path / "model"))
    np.testing.assert_allclose(loaded(tf.ones((2, 4))).numpy(), out.numpy(), rtol=1e-3)
    spec = tf.TensorSpec((2, 4), tf.float32)
    exported = loaded.__call__.get_concrete_function(spec).graph.as_graph_def()
    assert _matmul_dtypes(exported) == {tf.float32}
    in_hand = dense.__call__.get_concrete_function(spec).graph.as_graph_def()
    assert _matmul_dtypes(in_hand) == {tf.float16}
    original = dense.__call__.get_original_concrete_function(spec).graph.as_graph_def()
    assert _matmul_dtypes(original) == {tf.float32}
    assert dense(tf.ones((2, 4))).dtype == tf.float32  # and calls still run the rewrite
    assert len(dense.__call__.reports) == 1


def test_a_methods_config_reaches_every_objects_bound_function() -> None:
    """TensorFlow binds a tf.function method anew for each object, from the arguments it
    keeps; tf_amp.function's own config has to follow."""

    class Dense(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(tf.ones((4, 4)))

        @tf_amp.function(config=RewriteConfig(target_dtype="bfloat16"))
        def __call__(self, t: tf.Tensor) -> tf.Tensor:
            return tf.matmul(t, self.w)

    for dense in (Dense(), Dense()):
        dense(tf.ones((1, 4)))
        (rewritten,) = dense.__call__.rewritten_concrete_functions()
        assert _matmul_dtypes(rewritten.graph.as_graph_def()) == {tf.bfloat16}
        assert dense.__call__.rewrite_config.target_dtype == "bfloat16"


def test_strategy_run_runs_the_rewrite() -> None:
    """strategy.run copies a tf.function (``_clone``) to trace it in the replica context; the
    copy is a tf_amp function too (a plain copy ran float32 without a word), and its rewrite
    is reported on the function the user holds."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        dense = _Dense()

    @tf_amp.function
    def replica_step(t: tf.Tensor) -> tf.Tensor:
        return tf.matmul(t, dense.w)

    @tf.function
    def step(t: tf.Tensor) -> tf.Tensor:
        return strategy.run(replica_step, args=(t,))

    out = step(tf.ones((2, 4)))
    np.testing.assert_allclose(out.numpy(), 4.0)
    assert replica_step.reports and replica_step.reports[0].type_attrs_converted > 0


def test_a_nested_function_is_exported_float32_and_still_runs_rewritten(tmp_path) -> None:
    """A tf_amp function called inside another one's trace is traced float32 into it (the
    outer rewrite covers it): the outer's float32 trace, and so the SavedModel, hold no
    float16 op, while the call in hand runs the rewritten graph."""
    inner = _Dense()

    class Outer(tf.Module):
        def __init__(self) -> None:
            self.inner = inner

        @tf_amp.function
        def __call__(self, t: tf.Tensor) -> tf.Tensor:
            return self.inner(t) + 1.0

    outer = Outer()
    spec = tf.TensorSpec((2, 4), tf.float32)
    out = outer(tf.ones((2, 4)))
    original = outer.__call__.get_original_concrete_function(spec).graph.as_graph_def()
    assert _matmul_dtypes(original) == {tf.float32}
    in_hand = outer.__call__.get_concrete_function(spec).graph.as_graph_def()
    assert _matmul_dtypes(in_hand) == {tf.float16}
    tf.saved_model.save(outer, str(tmp_path / "model"))
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    exported = loaded.__call__.get_concrete_function(spec).graph.as_graph_def()
    assert _matmul_dtypes(exported) == {tf.float32}
    np.testing.assert_allclose(loaded(tf.ones((2, 4))).numpy(), out.numpy(), rtol=1e-3)


def test_run_functions_eagerly_runs_the_python_body() -> None:
    """``tf.config.run_functions_eagerly(True)`` (debugging) runs the body eagerly, as for
    tf.function: nothing is traced, so nothing is rewritten."""
    traced = []

    @tf_amp.function
    def body(t: tf.Tensor) -> tf.Tensor:
        traced.append(tf.executing_eagerly())
        return t * 2.0

    tf.config.run_functions_eagerly(True)
    try:
        assert float(body(tf.constant(1.0))) == 2.0
    finally:
        tf.config.run_functions_eagerly(False)
    assert traced == [True] and not body.reports


def test_checkpoints_are_interchangeable_with_float32(tmp_path) -> None:
    x, y = _data()
    amp_model, fp32_model = _cnn(0), _cnn(1)
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    train_step = _amp_train_step(amp_model, opt)

    for _ in range(5):
        train_step(x, y)
    path = tf.train.Checkpoint(model=amp_model).write(str(tmp_path / "amp"))
    tf.train.Checkpoint(model=fp32_model).read(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(amp_model(x).numpy(), fp32_model(x).numpy())

    # Reverse: float32 weights restored into the model the rewritten function trains.
    fp32_model.layers[-1].kernel.assign(tf.zeros_like(fp32_model.layers[-1].kernel))
    path = tf.train.Checkpoint(model=fp32_model).write(str(tmp_path / "fp32"))
    tf.train.Checkpoint(model=amp_model).read(path).assert_existing_objects_matched()
    assert not np.any(amp_model.layers[-1].kernel.numpy())
    train_step(x, y)  # the cached rewritten step still trains the restored variables
    assert np.any(amp_model.layers[-1].kernel.numpy())


def test_calling_convention_matches_tf_function() -> None:
    """Defaults, keyword-only arguments, numpy inputs, nested outputs, no outputs."""
    w = tf.Variable(tf.ones((4, 4)))

    def g(x, scale=2.0, *, shift):  # noqa: ANN001, ANN202 - mirrors an untyped user function
        return {"y": tf.matmul(x, w) * scale + shift, "none": None}

    amp, ref = tf_amp.function(g), tf.function(g)
    x = np.ones((2, 4), np.float32)
    for kwargs in ({"shift": 1.0}, {"scale": 3.0, "shift": tf.constant(1.0)}):
        got, want = amp(x, **kwargs), ref(x, **kwargs)
        assert got["none"] is None
        np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy(), rtol=1e-3)

    @tf_amp.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def update(t: tf.Tensor) -> None:
        w.assign_add(tf.matmul(t, w)[:4] * 0.0 + 1.0)

    assert update(tf.ones((4, 4))) is None
    np.testing.assert_allclose(w.numpy(), 2.0)  # the side effect ran on the real variable


def _log_checked(y: tf.Tensor) -> tf.Tensor:
    return tf.debugging.check_numerics(tf.math.log(y), "log went NaN")


def test_frame_hiding_is_reused_and_nests() -> None:
    """Entering the filter copied tf_amp's 108 file names into TensorFlow's C++ set on every
    call of a tf_amp.function (21 us of a ~270 us call): one filter per thread is reused
    now. Nested (a trace inside a trace) it must still be a filter of its own, or it would
    be its own parent (recursion without end)."""
    from tf_amp._upstream import tensorflow as upstream_tf

    files = frozenset({"/nowhere/a.py"})
    first = upstream_tf.hiding_frames_of(files)
    with first:
        inner = upstream_tf.hiding_frames_of(files)
        assert inner is not first
        with inner:
            assert inner.get_filtered_filenames() >= files
    assert upstream_tf.hiding_frames_of(files) is first


def test_a_runtime_error_quotes_the_users_lines_as_tf_function_does() -> None:
    """The rebuilt graph's ops were imported, so they had no creation stack: every error said
    "<stack traces unavailable>"."""

    @tf_amp.function
    def log_of_square(x: tf.Tensor) -> tf.Tensor:
        return _log_checked(tf.matmul(x, x) - 10.0)

    with pytest.raises(tf.errors.InvalidArgumentError, match="log went NaN") as caught:
        log_of_square(tf.ones((2, 2)))
    message = str(caught.value)
    assert "stack traces unavailable" not in message
    assert f'File "{__file__}"' in message
    assert "in log_of_square" in message and "in _log_checked" in message
    package = os.path.dirname(tf_amp.__file__)
    assert package + os.sep not in message  # tf_amp's own frames are left out, as TF's are


class _CallableWithState:
    """A user's callable whose attributes share names with the wrapper's own state."""

    def __init__(self) -> None:
        self._cache: dict[int, Any] = {}
        self.reports: list[Any] = []
        self._lock = False  # as a Keras Layer has
        self.units = 8

    def __call__(self, t: tf.Tensor) -> tf.Tensor:
        return tf.matmul(t, tf.ones((self.units, self.units)))


def test_wrapping_a_callable_object_keeps_both_states_apart() -> None:
    """``update_wrapper`` merged the object's ``__dict__`` over the wrapper's: a Keras model
    (``_lock = False``) failed every call, and a user's ``_cache`` held tf_amp's traces."""
    model = _cnn()
    x = _data(4)[0]
    np.testing.assert_allclose(
        tf_amp.function(model)(x).numpy(), tf.function(model)(x).numpy(), rtol=2e-2, atol=2e-2
    )
    obj = _CallableWithState()
    wrapped = tf_amp.function(obj)
    np.testing.assert_allclose(wrapped(tf.ones((2, 8))).numpy(), 8.0)
    assert obj._cache == {} and obj.reports == [] and obj._lock is False  # noqa: SLF001
    assert len(wrapped.reports) == 1
    assert wrapped.units == 8  # the object's other attributes show through, as with tf.function


def test_arguments_the_body_never_reads_are_accepted() -> None:
    """A flag, mask or step counter that no op reads: its placeholder has no reader left."""

    def f(x, w, unused, step):  # noqa: ANN001, ANN202 - mirrors an untyped user function
        return tf.matmul(x, w)

    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    w = np.eye(4, dtype=np.float32)
    amp = tf_amp.function(f)
    got = amp(x, w, tf.zeros([3]), tf.constant(7))
    np.testing.assert_allclose(got.numpy(), x, rtol=1e-3)
    assert amp.reports and amp.reports[-1].type_attrs_converted >= 1  # the matmul ran in half


def test_a_control_dependency_on_an_argument_survives_the_rebuild() -> None:
    """The argument placeholders are replaced at import; a ``^dep`` control input pointed at
    the removed one ("Unknown input node '^dep'")."""
    w = tf.Variable(tf.ones((8, 8)))
    counter = tf.Variable(0.0)

    def body(t: tf.Tensor, dep: tf.Tensor, only_ordered: tf.Tensor) -> tf.Tensor:
        with tf.control_dependencies([dep, only_ordered]):
            y = tf.matmul(t, w)
        with tf.control_dependencies([only_ordered.op]):
            counter.assign_add(1.0)
        return y + dep

    x, one = tf.ones((4, 8)), tf.constant(1.0)
    got = tf_amp.function(body)(x, one, one)
    np.testing.assert_allclose(got.numpy(), tf.function(body)(x, one, one).numpy(), rtol=1e-3)
    assert counter.numpy() == 2.0


def test_gradients_flow_through_a_rewritten_function() -> None:
    w = tf.Variable(tf.ones((4, 4)))
    forward = tf_amp.function(lambda t: tf.matmul(t, w))
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(forward(tf.ones((2, 4))))
    np.testing.assert_allclose(tape.gradient(total, w).numpy(), 2.0)
    assert "MatMul" in half_ops_of_functions(forward.rewritten_concrete_functions())



def _custom_gradient_model() -> tuple[tf.Variable, tf.Tensor, object]:
    """A matmul whose custom gradient triples the input's gradient and, as most custom
    gradients do, closes over a tensor of the forward pass (its input)."""
    rng = np.random.default_rng(0)
    w = tf.Variable(rng.standard_normal((8, 8)).astype(np.float32))
    x = tf.constant(rng.standard_normal((4, 8)).astype(np.float32))

    @tf.custom_gradient
    def tripled_matmul(a: tf.Tensor) -> tuple[tf.Tensor, object]:
        def grad(dy: tf.Tensor, variables: object = None) -> tuple[tf.Tensor, list]:
            return tf.matmul(dy, w, transpose_b=True) * 3.0, [tf.matmul(a, dy, transpose_a=True)]

        return tf.matmul(a, w), grad

    return w, x, lambda a: tf.nn.relu(tripled_matmul(a))


def test_a_custom_gradient_under_an_outer_tape_runs_float32(caplog) -> None:
    """Differentiated by a tape outside it, a rewritten function's custom gradient failed:
    TensorFlow calls the gradient function against the rewritten graph, where the forward
    tensor it closes over does not exist ("out of scope"). Such calls run the float32
    function and say why; with the tape inside, the function runs rewritten."""
    w, x, model = _custom_gradient_model()
    gradients = []
    for decorate in (tf.function, tf_amp.function):
        forward = decorate(model)
        with tf.GradientTape() as tape, caplog.at_level(logging.WARNING, "tf_amp"):
            tape.watch(x)
            loss = tf.reduce_sum(forward(x) ** 2)
        gradients.append([g.numpy() for g in tape.gradient(loss, [x, w])])
    for ours, theirs in zip(gradients[1], gradients[0], strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert "records outside it" in caplog.text

    @tf_amp.function
    def step() -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(model(x) ** 2)
        return tape.gradient(loss, [x, w])

    inside = [g.numpy() for g in step()]
    for ours, theirs in zip(inside, gradients[0], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=2e-2, atol=0.5)
    assert "MatMul" in half_ops_of_functions(step.rewritten_concrete_functions())


def test_a_loop_calling_a_function_under_an_outer_tape_runs_float32(caplog) -> None:
    """Differentiated by a tape outside it, a rebuilt while loop whose body calls a function
    failed: the loop's gradient differentiates the call symbolically, which needs the
    variable's handle data the rebuilt body lost. Such calls run float32 and say why."""
    w = tf.Variable(np.linspace(-0.3, 0.3, 64, dtype=np.float32).reshape(8, 8))
    x = tf.constant(np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8))
    step = tf.function(lambda t: tf.tanh(tf.matmul(t, w)))

    def unrolled(t: tf.Tensor) -> tf.Tensor:
        _, out = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, step(a)), (0, t))
        return tf.reduce_sum(out)

    gradients, forwards = [], []
    for decorate in (tf.function, tf_amp.function):
        forward = decorate(unrolled)
        forwards.append(forward(x).numpy())  # no tape: runs rewritten
        with tf.GradientTape() as tape, caplog.at_level(logging.WARNING, "tf_amp"):
            loss = forward(x)
        gradients.append(tape.gradient(loss, w).numpy())
    np.testing.assert_array_equal(gradients[1], gradients[0])
    assert "a while loop whose body calls a function" in caplog.text
    np.testing.assert_allclose(forwards[1], forwards[0], rtol=2e-2)
    assert forwards[1] != forwards[0]  # the untaped call ran the half graph


def test_the_op_that_marks_a_saved_custom_gradient_stays_float32(tmp_path) -> None:
    """A SavedModel holds its custom gradients' functions. ``tf.custom_gradient``'s IdentityN
    (clear list) was painted half between half ops, so the model rewritten by ``tf-amp
    rewrite`` and then differentiated handed the float32 gradient function a half tensor
    ("Expects arg[0] to be float but half is provided")."""
    from tensorflow.core.protobuf import saved_model_pb2

    w, x, model = _custom_gradient_model()
    module = tf.Module()
    module.w = w
    module.forward = tf.function(model, input_signature=[tf.TensorSpec(x.shape, tf.float32)])
    tf.saved_model.save(module, str(tmp_path))
    saved = saved_model_pb2.SavedModel.FromString((tmp_path / "saved_model.pb").read_bytes())
    graph_def = saved.meta_graphs[0].graph_def
    assert graph_def.library.registered_gradients  # the gradient function travels with it
    out = tf_amp.rewrite_graph_def(graph_def, RewriteConfig(target_dtype="float16")).graph_def
    nodes = [n for f in out.library.function for n in f.node_def]
    marks = [n for n in nodes if "_gradient_op_type" in n.attr]
    assert marks and all(
        t == tf.float32.as_datatype_enum for n in marks for t in n.attr["T"].list.type
    )
    assert any(n.op == "MatMul" and n.attr["T"].type == tf.half for n in nodes)


METHOD_SCRIPT = """
import tensorflow as tf, tf_amp

class Scaler(tf.Module):
    def __init__(self):
        self.w = tf.Variable(tf.ones([8, 8]))

    @tf_amp.function
    def __call__(self, x):
        return tf.matmul(x, self.w)

print(float(Scaler()(tf.ones([2, 8]))[0, 0]))
"""


def test_a_method_decorated_without_deprecated_arguments_gets_no_deprecation_warning() -> None:
    """tf_amp.function passes tf.function only the arguments the user gave: passing
    experimental_follow_type_hints=None made TensorFlow log that it is deprecated. In a
    fresh process, because TensorFlow logs each deprecation once per process."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", METHOD_SCRIPT], env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "8.0"
    assert "deprecated" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("decorate", ["tf_amp.function", "environment"])
def test_a_variable_made_from_the_arguments_on_the_first_call(decorate: str, caplog) -> None:
    # tf.function cannot lift such an initial value out of the graph and initialises the
    # variable by running its first trace; tf_amp went through get_concrete_function, which
    # has no such fallback, and raised UnliftableError (the environment's tf.function too).
    state: dict[str, tf.Variable] = {}

    def body(x: tf.Tensor) -> tf.Tensor:
        if "v" not in state:
            state["v"] = tf.Variable(x * 2.0)
        return tf.matmul(state["v"], tf.ones((4, 4)))

    if decorate == "tf_amp.function":
        fn, switch = tf_amp.function(body), contextlib.nullcontext()
    else:  # what the environment activation's tf.function returns, while it is on
        fn = upstream_tf.retype_tf_function(upstream_tf.tf_function(body), AmpTfFunction)
        switch = activation.activated()
    x = tf.ones((2, 4))
    with switch:
        with caplog.at_level(logging.INFO, logger="tf_amp"):
            first = fn(x)
        np.testing.assert_array_equal(first.numpy(), np.full((2, 4), 8.0, np.float32))
        np.testing.assert_array_equal(state["v"].numpy(), np.full((2, 4), 2.0, np.float32))
        assert "cannot lift" in caplog.text
        second = fn(x)  # the variable exists: traced again, rewritten and run
    np.testing.assert_allclose(second.numpy(), 8.0)
    rebuilt = fn.rewritten_concrete_functions()
    assert len(rebuilt) == 1
    assert any(op.type == "MatMul" and op.get_attr("T") == tf.float16
               for op in rebuilt[0].graph.get_operations())


def test_function_attributes_reach_the_function_that_runs() -> None:
    # experimental_attributes / experimental_implements were dropped by the rebuild: the
    # FunctionDef that ran had none (TFLite fusion reads _implements, Grappler _noinline).
    fn = tf_amp.function(lambda t: tf.matmul(t, t), experimental_attributes={"_noinline": True},
                         experimental_implements="my_matmul")
    rebuilt = fn.get_concrete_function(tf.TensorSpec((4, 4), tf.float32))
    attrs = rebuilt.function_def.attr
    assert attrs["_noinline"].b is True
    assert attrs["_implements"].s == b"my_matmul"
    assert any(op.type == "MatMul" and op.get_attr("T") == tf.float16
               for op in rebuilt.graph.get_operations())
    np.testing.assert_allclose(fn(tf.ones((4, 4))).numpy(), 4.0)


def test_a_returned_tensor_array_keeps_the_element_dtype_it_promised(monkeypatch) -> None:
    # Its list ops took the half element type of the MatMul writing into it; the caller's
    # float32 stack then failed ("op elements float but list elements half").
    monkeypatch.setenv("TF_AMP_TARGET_DTYPE", "float16")
    x = tf.random.stateless_normal([4, 8], seed=(1, 2))
    w = tf.random.stateless_normal([8, 8], seed=(3, 4))

    def write_two(a: tf.Tensor) -> tf.TensorArray:
        array = tf.TensorArray(tf.float32, size=2)
        return array.write(0, tf.matmul(a, w)).write(1, a)

    def stack(handle: tf.Tensor) -> tf.Tensor:  # what a caller does with the returned list
        return tf.raw_ops.TensorListStack(input_handle=handle, element_shape=[4, 8],
                                          element_dtype=tf.float32)

    want = stack(tf.function(write_two)(x))
    got = stack(tf_amp.function(write_two)(x))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-2, atol=1e-2)


def test_a_dropped_function_takes_its_rewritten_library_functions_with_it():
    """The rebuild registered its renamed library functions (a cond's branches) with the eager
    runtime for the whole process: 200 functions made and dropped left 400 registered, where
    a plain tf.function leaves none. They now go with the last function that can call them:
    a graph that calls a rebuilt function keeps them after the tf_amp.function is gone."""
    import gc

    from tensorflow.python.eager import context

    w = tf.Variable(tf.ones((8, 8)))
    config = RewriteConfig(target_dtype="float16")

    def made_and_called():
        @tf_amp.function(config=config)
        def f(x):
            y = tf.matmul(x, w)
            return tf.cond(tf.reduce_sum(y) > 0, lambda: y * 2.0, lambda: y)

        f(tf.ones((4, 8)))
        return f

    kept = made_and_called()
    dropped_later = [made_and_called()]
    outer = tf.function(lambda x: dropped_later[0](x) + 1.0)
    outer(tf.ones((4, 8)))
    dropped_later.clear()
    gc.collect()
    before = len(context.context().list_function_names())
    for _ in range(10):
        made_and_called()
    gc.collect()
    assert len(context.context().list_function_names()) == before
    np.testing.assert_allclose(kept(tf.ones((4, 8))), np.full((4, 8), 16.0))
    np.testing.assert_allclose(outer(tf.ones((4, 8))), np.full((4, 8), 17.0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(kept(tf.ones((4, 8))))
    np.testing.assert_allclose(tape.gradient(loss, w), np.full((8, 8), 8.0))


def test_a_graph_calling_a_rewritten_function_with_a_cond_exports(tmp_path) -> None:
    """The first way of holding the rebuild's library functions put objects in the graph's
    function table that could not give their ``.graph``: exporting the rewritten function as
    a signature, and a graph that calls it with its shapes (what TF1's ``Saver`` writes),
    failed ("Can not generate structured signature")."""
    module = tf.Module()
    module.w = tf.Variable(tf.eye(8))
    module.f = tf_amp.function(
        lambda x: tf.cond(tf.reduce_sum(x) > 0, lambda: tf.matmul(x, module.w), lambda: x),
        config=RewriteConfig(target_dtype="float16"),
    )
    rewritten = module.f.get_concrete_function(tf.TensorSpec((4, 8)))
    outer = tf.function(lambda x: module.f(x) + 1.0).get_concrete_function(tf.TensorSpec((4, 8)))
    outer.graph.as_graph_def(add_shapes=True)
    tf.saved_model.save(module, str(tmp_path / "m"), signatures=rewritten)
    loaded = tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]
    np.testing.assert_allclose(loaded(tf.ones((4, 8)))["output_0"], np.ones((4, 8)))
