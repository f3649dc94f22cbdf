"""Specification of tf_amp.ops.unscale_and_check_finite: native op and TF fallback.

Every case runs on both paths (``use_native`` True / False); the native library must be built
(``pip install --no-build-isolation -e .``), and a missing build fails these tests rather than
silently testing the fallback twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from tf_amp import ops

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
PATHS = [pytest.param(True, id="native"), pytest.param(False, id="fallback")]
SCALE = 1536.0  # not a power of two: rounding of 1/scale matters and must match TF exactly


def numpy_reference(values: np.ndarray, dtype: tf.DType, scale: float) -> np.ndarray:
    """What the op promises, computed in numpy (see tf_amp/ops.py's arithmetic contract)."""
    if dtype == tf.float64:
        return values * (1.0 / np.float64(np.float32(scale)))
    inverse = np.float32(1.0) / np.float32(scale)
    if dtype == tf.float32:
        return values * inverse
    wide = values.astype(np.float32) * inverse
    return wide.astype(ml_dtypes.bfloat16 if dtype == tf.bfloat16 else np.float16)


def random_grads(dtype: tf.DType, shapes, seed: int = 0) -> list[tf.Tensor]:
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.standard_normal(shape) * 100.0, dtype=dtype) for shape in shapes]


def assert_bitwise_equal(actual: tf.Tensor, expected) -> None:
    actual_np = actual.numpy()
    expected_np = np.asarray(expected).astype(actual_np.dtype)
    assert actual_np.shape == expected_np.shape
    np.testing.assert_array_equal(actual_np.view(np.uint8), expected_np.view(np.uint8))


@pytest.fixture(scope="module", autouse=True)
def _native_library_is_built():
    assert ops.native_op_available(), (
        "native op library not loaded; build it with `pip install --no-build-isolation -e .`"
    )


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_finite_gradients_are_unscaled_exactly(dtype, use_native):
    grads = random_grads(dtype, [(3, 5), (1000,), (7, 1, 3)])
    unscaled, all_finite = ops.unscale_and_check_finite(grads, SCALE, use_native=use_native)
    assert bool(all_finite.numpy()) is True
    for grad, out in zip(grads, unscaled, strict=True):
        assert out.dtype == dtype and out.shape == grad.shape
        assert_bitwise_equal(out, numpy_reference(grad.numpy(), dtype, SCALE))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_matches_tensorflow_multiply_by_inverse(dtype):
    # For float32/float64 the op is `g * (1/scale)`; for half types with a power-of-two scale
    # (what dynamic loss scaling uses) it also equals Keras's `g * cast(1/scale, g.dtype)`.
    scale = 2.0**15 if dtype in (tf.float16, tf.bfloat16) else SCALE
    (grad,) = random_grads(dtype, [(4096,)], seed=3)
    (out,), _ = ops.unscale_and_check_finite([grad], scale, use_native=True)
    if dtype == tf.float64:
        expected = grad * (1.0 / tf.cast(tf.constant(scale, tf.float32), tf.float64))
    else:
        expected = grad * tf.cast(1.0 / tf.constant(scale, tf.float32), dtype)
    assert_bitwise_equal(out, expected.numpy())


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("bad_value", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("position", ["first", "middle", "last", "last_tensor"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_any_non_finite_element_clears_the_flag(dtype, position, bad_value, use_native):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(shape) for shape in [(1001,), (33, 3), (517,)]]
    target = arrays[-1] if position == "last_tensor" else arrays[0]
    index = {"first": 0, "middle": target.size // 2, "last": target.size - 1}.get(position, 250)
    target.reshape(-1)[index] = bad_value
    grads = [tf.constant(a, dtype=dtype) for a in arrays]
    unscaled, all_finite = ops.unscale_and_check_finite(grads, SCALE, use_native=use_native)
    assert bool(all_finite.numpy()) is False
    for grad, out in zip(grads, unscaled, strict=True):
        expected = numpy_reference(grad.numpy(), dtype, SCALE)
        np.testing.assert_array_equal(
            np.isnan(out.numpy().astype(np.float64)), np.isnan(expected.astype(np.float64))
        )


@pytest.mark.parametrize("use_native", PATHS)
def test_overflow_while_unscaling_counts_as_non_finite(use_native):
    # A scale below one can push a finite float16 gradient past 65504.
    grad = tf.constant([60000.0, 1.0], tf.float16)
    (out,), all_finite = ops.unscale_and_check_finite([grad], 0.5, use_native=use_native)
    assert np.isinf(out.numpy()[0]) and bool(all_finite.numpy()) is False


@pytest.mark.parametrize("use_native", PATHS)
def test_no_gradients(use_native):
    unscaled, all_finite = ops.unscale_and_check_finite([], SCALE, use_native=use_native)
    assert unscaled == [] and bool(all_finite.numpy()) is True


@pytest.mark.parametrize("use_native", PATHS)
def test_zero_size_tensors(use_native):
    grads = [tf.zeros((0,), tf.float32), tf.zeros((3, 0), tf.float16), tf.constant([2.0])]
    unscaled, all_finite = ops.unscale_and_check_finite(grads, 2.0, use_native=use_native)
    assert bool(all_finite.numpy()) is True
    assert [u.shape for u in unscaled] == [g.shape for g in grads]
    assert unscaled[2].numpy().tolist() == [1.0]


@pytest.mark.parametrize("use_native", PATHS)
def test_none_entries_and_indexed_slices_keep_their_structure(use_native):
    values = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    sparse = tf.IndexedSlices(values * 8.0, tf.constant([0, 5]), tf.constant([10, 2]))
    grads = [None, sparse, tf.constant([8.0]), None]
    unscaled, all_finite = ops.unscale_and_check_finite(grads, 8.0, use_native=use_native)
    assert unscaled[0] is None and unscaled[3] is None
    assert isinstance(unscaled[1], tf.IndexedSlices)
    np.testing.assert_array_equal(unscaled[1].values.numpy(), values.numpy())
    assert unscaled[1].indices is sparse.indices
    assert unscaled[1].dense_shape is sparse.dense_shape
    assert bool(all_finite.numpy()) is True

    bad = tf.IndexedSlices(tf.constant([[np.nan, 0.0]]), tf.constant([1]), tf.constant([4, 2]))
    _, all_finite = ops.unscale_and_check_finite([bad], 8.0, use_native=use_native)
    assert bool(all_finite.numpy()) is False


@pytest.mark.parametrize("use_native", PATHS)
def test_inside_tf_function_with_a_variable_scale(use_native):
    scale = tf.Variable(4.0)

    @tf.function
    def step(x, y):
        return ops.unscale_and_check_finite([x, y], scale, use_native=use_native)

    (ux, uy), ok = step(tf.constant([4.0, 8.0]), tf.constant([2.0], tf.float16))
    assert ux.numpy().tolist() == [1.0, 2.0] and uy.numpy().tolist() == [0.5]
    assert bool(ok.numpy()) is True
    scale.assign(0.0)  # 1/0 = inf: every non-zero gradient becomes inf
    _, ok = step(tf.constant([4.0]), tf.constant([2.0], tf.float16))
    assert bool(ok.numpy()) is False


def test_in_a_tf1_graph_with_static_shapes():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float16, [2])
        (ux, uy), ok = ops.unscale_and_check_finite([x, y], 2.0, use_native=True)
        assert ux.shape.as_list() == [None, 3] and uy.shape.as_list() == [2]
        assert ok.shape.rank == 0 and ok.dtype == tf.bool
        assert ux.op.type == "TfAmpUnscaleAndCheckFinite"
    with tf.compat.v1.Session(graph=graph) as session:
        out, flag = session.run([ux, ok], {x: [[2.0, 4.0, 6.0]], y: [1.0, 1.0]})
    assert out.tolist() == [[1.0, 2.0, 3.0]] and flag


@pytest.mark.parametrize("use_native", PATHS)
def test_not_differentiable(use_native):
    x, scale = tf.Variable([1.0, 2.0]), tf.Variable(2.0)
    with tf.GradientTape() as tape:
        (out,), _ = ops.unscale_and_check_finite([x * 3.0], scale, use_native=use_native)
        loss = tf.reduce_sum(out)
    assert tape.gradient(loss, [x, scale]) == [None, None]


@pytest.mark.parametrize("use_native", PATHS)
@pytest.mark.parametrize("scale", [[1.0, 2.0], [2.0]], ids=["two", "one_element"])
def test_non_scalar_scale_is_rejected(use_native, scale):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="scalar|rank|shape"):
        ops.unscale_and_check_finite([tf.constant(1.0)], tf.constant(scale),
                                     use_native=use_native)


def test_every_bfloat16_nan_stays_a_quiet_nan_of_its_sign():
    """(tf.cast's vectorised loop drops a nan's sign, its scalar tail keeps it: the fallback
    agrees with this only in being a nan.)"""
    bits = np.arange(0x7f81, 0x8000, dtype=np.uint16)
    nans = np.concatenate([bits, bits | 0x8000])
    (out,), finite = ops.unscale_and_check_finite(
        [tf.constant(nans.view(ml_dtypes.bfloat16))], 3.0, use_native=True
    )
    out_bits = out.numpy().view(np.uint16)
    np.testing.assert_array_equal(out_bits, (nans & 0x8000) | 0x7fc0)
    assert not bool(finite)


def test_unsupported_dtype_names_the_gradient():
    with pytest.raises(TypeError, match="gradient 1 has dtype int32"):
        ops.unscale_and_check_finite([tf.constant([1.0]), tf.constant([1])], 2.0)


def test_a_single_tensor_instead_of_a_list_is_refused():
    # It used to be iterated row by row: [[2, 1], [4, 3]] came back as two "gradients".
    with pytest.raises(TypeError, match="a list of gradients, got a single"):
        ops.unscale_and_check_finite(tf.constant([[4.0, 2.0], [8.0, 6.0]]), 2.0)


def test_a_gradient_that_is_no_tensor_is_named():
    (converted,), _ = ops.unscale_and_check_finite([[4.0, 2.0]], 2.0)  # like a numpy array
    np.testing.assert_array_equal(converted.numpy(), [2.0, 1.0])
    with pytest.raises(TypeError, match="gradient 1 is not a tensor"):
        ops.unscale_and_check_finite([tf.constant([1.0]), object()], 2.0)


def test_a_complex_scale_is_refused():
    # tf.cast to float32 dropped the imaginary part without a word.
    with pytest.raises(TypeError, match="scale must be a real number, got complex128"):
        ops.unscale_and_check_finite([tf.constant([1.0])], 2 + 1000j)


def test_hundred_million_elements():
    n = 100_000_000
    grad = tf.fill([n], tf.constant(3.0))
    (out,), all_finite = ops.unscale_and_check_finite([grad], 2.0, use_native=True)
    assert bool(all_finite.numpy()) is True
    assert float(tf.reduce_min(out)) == 1.5 and float(tf.reduce_max(out)) == 1.5
    poisoned = tf.tensor_scatter_nd_update(grad, [[n - 1]], [np.inf])
    _, all_finite = ops.unscale_and_check_finite([poisoned], 2.0, use_native=True)
    assert bool(all_finite.numpy()) is False


def _run_python(code: str, **env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env},
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_portable_and_vectorised_cpu_kernels_agree_bit_for_bit(tmp_path):
    # TF_AMP_CPU_KERNELS=portable pins the portable loops; compare them with the default ones
    # over every dtype, odd lengths (vector tails) and special values.
    code = f"""
        import numpy as np, tensorflow as tf
        from tf_amp import ops
        rng = np.random.default_rng(7)
        special = np.array([0.0, -0.0, 1e-8, 6e-8, 65504.0, 65520.0, 1e30, np.inf, -np.inf, np.nan])
        out = {{}}
        for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64):
            values = np.concatenate([rng.standard_normal(1003) * 1e4, special])
            (u,), ok = ops.unscale_and_check_finite([tf.constant(values, dtype)], 0.75,
                                                    use_native=True)
            out[dtype.name] = u.numpy().view(np.uint8)
        np.savez(r"{tmp_path}/" + __import__("os").environ.get("TF_AMP_CPU_KERNELS", "best"), **out)
    """
    _run_python(code)
    _run_python(code, TF_AMP_CPU_KERNELS="portable")
    best, portable = np.load(tmp_path / "best.npz"), np.load(tmp_path / "portable.npz")
    for name in best.files:
        np.testing.assert_array_equal(best[name], portable[name], err_msg=name)


def test_fallback_warning_says_why_and_appears_once():
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(
            """
            import logging, tensorflow as tf
            logging.basicConfig(level=logging.WARNING, format="%(message)s")
            from tf_amp import ops
            assert not ops.native_op_available()
            for _ in range(3):
                (u,), ok = ops.unscale_and_check_finite([tf.constant([4.0])], 2.0)
            print(float(u[0]), bool(ok))
            """)],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_AMP_FORCE_FALLBACK_OP": "1"},
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["2.0", "True"]
    warnings = [line for line in result.stderr.splitlines() if "native" in line]
    assert len(warnings) == 1 and "TF_AMP_FORCE_FALLBACK_OP is set" in warnings[0]


@pytest.mark.parametrize(("value", "native"), [("0", True), ("false", True), ("off", True),
                                               ("1", False), ("yes", False)])
def test_force_fallback_variable_takes_the_usual_flag_spellings(value, native):
    _run_python(
        f"""
        from tf_amp import ops
        assert ops.native_op_available() is {native}
        """,
        TF_AMP_FORCE_FALLBACK_OP=value,
    )


def test_force_fallback_variable_with_a_bad_value_names_it():
    _run_python(
        """
        from tf_amp import ops
        try:
            ops.native_op_available()
        except ValueError as error:
            assert "TF_AMP_FORCE_FALLBACK_OP='maybe'" in str(error), error
        else:
            raise SystemExit("no error")
        """,
        TF_AMP_FORCE_FALLBACK_OP="maybe",
    )


def test_native_requested_but_unavailable_raises():
    _run_python(
        """
        import tensorflow as tf
        from tf_amp import ops
        try:
            ops.unscale_and_check_finite([tf.constant([1.0])], 2.0, use_native=True)
        except RuntimeError as error:
            assert "unavailable" in str(error)
        else:
            raise SystemExit("no error")
        """,
        TF_AMP_FORCE_FALLBACK_OP="1",
    )


def test_mixed_dtypes_spanning_many_work_units():
    # Several MB of odd-sized tensors of every dtype: the CPU kernel cuts this virtual byte range
    # into 256 KiB units that start and end inside tensors and span tensor boundaries.
    rng = np.random.default_rng(11)
    dtypes = [tf.float16, tf.float32, tf.bfloat16, tf.float64] * 4
    sizes = [int(n) for n in rng.integers(1, 300_000, size=len(dtypes))]
    grads = [tf.constant(rng.standard_normal(n) * 50.0, dtype=d) for n, d in
             zip(sizes, dtypes, strict=True)]
    unscaled, all_finite = ops.unscale_and_check_finite(grads, SCALE, use_native=True)
    assert bool(all_finite.numpy()) is True
    for grad, out in zip(grads, unscaled, strict=True):
        assert_bitwise_equal(out, numpy_reference(grad.numpy(), grad.dtype, SCALE))

    unit_elements = 256 * 1024 // 4  # a float32 tensor's first unit boundary, if it starts one
    for target in range(len(grads)):
        values = grads[target].numpy().copy()
        values[min(unit_elements, values.size - 1)] = np.nan
        poisoned = [*grads[:target], tf.constant(values), *grads[target + 1:]]
        _, all_finite = ops.unscale_and_check_finite(poisoned, SCALE, use_native=True)
        assert bool(all_finite.numpy()) is False, f"nan in tensor {target} missed"


def test_xla_compiled_functions_use_the_compilable_path():
    # The native op has no XLA kernel: under jit_compile the TF ops are traced instead, and the
    # results are the same bits.
    grads = random_grads(tf.float16, [(9, 4)], seed=5) + random_grads(tf.float32, [(100,)])

    @tf.function(jit_compile=True)
    def compiled(a, b):
        (ua, ub), ok = ops.unscale_and_check_finite([a, b], SCALE)
        return ua, ub, ok

    op_types = {op.type for op in compiled.get_concrete_function(*grads).graph.get_operations()}
    assert "TfAmpUnscaleAndCheckFinite" not in op_types
    ua, ub, ok = compiled(*grads)
    assert bool(ok.numpy()) is True
    assert_bitwise_equal(ua, numpy_reference(grads[0].numpy(), tf.float16, SCALE))
    assert_bitwise_equal(ub, numpy_reference(grads[1].numpy(), tf.float32, SCALE))


def test_a_new_process_that_imports_tf_amp_ops_knows_the_op(tmp_path):
    # A SavedModel whose step uses the fused op, loaded in a new process: "Op type not
    # registered 'TfAmpUnscaleAndCheckFinite'" although tf_amp.ops was imported, since the
    # library was only loaded at the first unscale. The rewrite of such a graph took tf_amp's
    # own op for a foreign one and kept its node float32 with a warning.
    path = tmp_path / "saved"
    _run_python(
        f"""
        import tensorflow as tf
        from tf_amp import ops

        class Step(tf.Module):
            @tf.function(input_signature=[tf.TensorSpec([2], tf.float32)])
            def unscale(self, g):
                (u,), finite = ops.unscale_and_check_finite([g], 2.0, use_native=True)
                return u, finite

        tf.saved_model.save(Step(), r"{path}")
        graph = Step().unscale.get_concrete_function().graph.as_graph_def()
        with open(r"{tmp_path}/graph.pb", "wb") as f:
            f.write(graph.SerializeToString())
        """
    )
    out = _run_python(
        f"""
        import tensorflow as tf
        import tf_amp.ops
        u, finite = tf.saved_model.load(r"{path}").unscale(tf.constant([4.0, 8.0]))
        print(u.numpy().tolist(), bool(finite))
        """
    )
    assert out.split("\n")[0] == "[2.0, 4.0] True"
    out = _run_python(
        f"""
        import tensorflow as tf
        import tf_amp
        graph = tf.compat.v1.GraphDef.FromString(open(r"{tmp_path}/graph.pb", "rb").read())
        print(tf_amp.rewrite_graph_def(graph).report.unknown_ops)
        """,
        TF_AMP_TARGET_DTYPE="float16",
    )
    assert out.strip() == "[]"


def test_vectorized_map_runs_the_op_over_every_example_at_once() -> None:
    """Per-example gradients under the environment's loss scaling call the op inside
    ``tf.vectorized_map``. pfor had no conversion for it and ran it one example at a time in
    a ``while_loop`` (warning "no registered converter"); it now runs once over the stacked
    examples, with one finite flag per example, as ``tf.map_fn`` gives."""
    grads = np.full((4, 3, 2), 8.0, np.float32)
    grads[2, 1, 0] = np.inf
    shared = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2))

    def one(example):
        (unscaled, unscaled_shared), finite = ops.unscale_and_check_finite(
            [example, shared], 4.0)
        return unscaled, unscaled_shared, finite

    vectorized = tf.function(lambda: tf.vectorized_map(one, tf.constant(grads)))
    looped = tf.function(lambda: tf.map_fn(
        one, tf.constant(grads), fn_output_signature=(tf.float32, tf.float32, tf.bool)))
    for got, want in zip(vectorized(), looped(), strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(vectorized()[2].numpy(), [True, True, False, True])
    graph = vectorized.get_concrete_function().graph.as_graph_def()
    op_types = {n.op for n in graph.node}
    op_types |= {n.op for f in graph.library.function for n in f.node_def}
    assert "While" not in op_types and "StatelessWhile" not in op_types
