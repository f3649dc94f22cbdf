"""The accumulator guard (``tf_amp.painter.accumulator_guard``): a loop's running sum stays
float32, in the forward loop, in the gradient loop (a weight's gradient summed over the
iterations) and in TF1 loops, with no more Casts than painting it half."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _model_graphs import v1_control_flow

import tf_amp
from tf_amp import RewriteConfig, rewrite_graph_def

STEPS = 300


def _loop_step(xs: tf.Tensor, w: tf.Variable):
    """A tanh RNN over ``xs`` whose loss is the running sum of every step's outputs."""

    def step(xs: tf.Tensor):
        with tf.GradientTape() as tape:

            def body(t, h, total):
                h = tf.tanh(tf.matmul(h, w) + xs[t])
                return t + 1, h, total + tf.reduce_sum(h)

            start = (0, tf.zeros((8, 32)), tf.constant(0.0))
            _, _, total = tf.while_loop(lambda t, h, s: t < STEPS, body, start)
        return total, tape.gradient(total, w)

    return step


@pytest.fixture(scope="module")
def loop_inputs():
    rng = np.random.default_rng(0)
    w = tf.Variable(rng.standard_normal((32, 32)).astype(np.float32) * 0.05)
    xs = tf.constant(rng.standard_normal((STEPS, 8, 32)).astype(np.float32))
    return w, xs


def _run(loop_inputs, **config):
    w, xs = loop_inputs
    fn = tf_amp.function(_loop_step(xs, w), config=RewriteConfig(**config))
    total, grad = fn(xs)
    return float(total), grad, fn


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_a_loops_running_sum_and_its_weight_gradient_keep_float32_precision(
    loop_inputs, target
):
    """Unguarded, the sum over 300 steps ended 11% low in bfloat16 (each addend lost below
    half a unit of the sum), and the gradient loop summed the weight's gradient in half."""
    w, xs = loop_inputs
    want_total, want_grad = tf.function(_loop_step(xs, w))(xs)
    errors = {}
    for guard in (True, False):
        total, grad, _ = _run(loop_inputs, target_dtype=target, guard_accumulators=guard)
        errors[guard] = (
            abs(total - float(want_total)) / abs(float(want_total)),
            float(tf.norm(grad - want_grad) / tf.norm(want_grad)),
        )
    loss_bound, grad_bound = (0.005, 0.002) if target == "float16" else (0.04, 0.01)
    assert errors[True][0] < loss_bound and errors[True][1] < grad_bound, errors
    # The guard is what makes the difference: off, the gradient (and in bfloat16 the sum)
    # is several times further from float32's.
    assert errors[False][1] > 3 * errors[True][1], errors
    if target == "bfloat16":
        assert errors[False][0] > 0.08, errors


UPDATES = {
    "directly": lambda total, m: total + m,
    "through_identity_n": lambda total, m: tf.identity_n([total + m])[0],
    "two_sums": lambda total, m: total + m + m,
    "reshaped": lambda total, m: tf.reshape(total + m, [4, 4]),
    "decayed": lambda total, m: 0.999 * total + m,
    "minus": lambda total, m: total - m,
}


def _small_products():
    rng = np.random.default_rng(0)
    a = tf.constant(rng.uniform(0, 0.1, (4, 16)).astype(np.float32))
    b = tf.constant(rng.uniform(0, 0.1, (16, 4)).astype(np.float32))
    return a, b


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_a_sum_of_many_small_products_keeps_growing_in_float16(update):
    """Unguarded, the float16 sums stopped at 64 to 256, a mean of 128 (each addend of about
    0.04 is below half a unit there); float32's mean is 229.6. Sums written as chains, through
    a reshape or with a decay were missed at first."""
    a, b = _small_products()
    step = UPDATES[update]

    def summed(a, b):
        def body(i, total):
            return i + 1, step(total, tf.matmul(a, b))

        return tf.while_loop(lambda i, total: i < 5000, body, (0, tf.zeros((4, 4))))[1]

    want = tf.function(summed)(a, b)
    results = {
        guard: tf_amp.function(summed, config=RewriteConfig(
            target_dtype="float16", guard_accumulators=guard))(a, b)
        for guard in (True, False)
    }
    np.testing.assert_allclose(results[True], want, rtol=3e-3)
    if update == "directly":
        assert float(tf.reduce_mean(results[False])) < 0.7 * float(tf.reduce_mean(want))


def test_a_lowered_loops_running_value_stays_float32_with_its_sum():
    """A nested tf.function call makes tf_amp inline it, which lowers the loop to TF1 form
    (Merge / Switch / NextIteration). With a half op reading the loop's result, the loop
    variable took its neighbour's colour and rounded the float32 sum back to bfloat16 every
    iteration: 16.0 where float32 gives 137.8, guarded or not."""
    a, b = _small_products()

    @tf.function
    def head(t):
        return tf.matmul(t, tf.eye(4))

    def summed(a, b):
        body = lambda i, t: (i + 1, t + tf.matmul(a, b))  # noqa: E731
        return head(tf.while_loop(lambda i, t: i < 3000, body, (0, tf.zeros((4, 4))))[1])

    want = tf.function(summed)(a, b)
    amp = tf_amp.function(summed, config=RewriteConfig(target_dtype="bfloat16"))
    np.testing.assert_allclose(amp(a, b), want, rtol=1.5e-2)  # its head MatMul: bfloat16
    (report,) = amp.reports
    kept = {d.op for d in report.decisions if "running sum" in d.reason and d.dtype == "float32"}
    assert {"AddV2", "Merge", "NextIteration"} <= kept, kept


CONDITIONS = {
    "cond": lambda i, total, m: tf.cond(i % 3 < 2, lambda: total + m(), lambda: total),
    "cond_in_cond": lambda i, total, m: tf.cond(
        i % 3 < 2,
        lambda: tf.cond(i % 2 < 1, lambda: total + m(), lambda: total - m()),
        lambda: tf.identity(total),
    ),
    "switch_case": lambda i, total, m: tf.switch_case(
        i % 3, [lambda: total + m(), lambda: total + m(), lambda: total]
    ),
}


@pytest.fixture(scope="module")
def wanted_conditional_sums():
    return {}


@pytest.mark.parametrize("lowered", [False, True], ids=["functional", "lowered"])
@pytest.mark.parametrize("condition", sorted(CONDITIONS))
def test_a_sum_under_a_condition_keeps_growing(condition, lowered, wanted_conditional_sums):
    """AutoGraph makes ``if ...: acc += x`` in a loop a ``tf.cond``: the sum is in a branch
    function (an ``If`` node in the loop body), or, once inlining lowers it, between the
    condition's ``Switch`` and ``Merge``. Unguarded, the float16 sum of a product computed in
    the branch stopped at 128 where float32 reached 229.6; bfloat16 stopped at 16."""
    a, b = _small_products()
    update = CONDITIONS[condition]

    @tf.function
    def head(t):  # calling a tf.function makes tf_amp inline it, which lowers the loop
        return tf.matmul(t, tf.eye(4))

    def summed(a, b):
        def body(i, total):
            return i + 1, update(i, total, lambda: tf.matmul(a, b))

        total = tf.while_loop(lambda i, t: i < 7500, body, (0, tf.zeros((4, 4))))[1]
        return head(total) if lowered else total

    if (condition, lowered) not in wanted_conditional_sums:
        wanted_conditional_sums[condition, lowered] = tf.function(summed)(a, b)
    want = wanted_conditional_sums[condition, lowered]
    for target, rtol in (("float16", 3e-3), ("bfloat16", 1.5e-2)):
        amp = tf_amp.function(summed, config=RewriteConfig(target_dtype=target))
        np.testing.assert_allclose(amp(a, b), want, rtol=rtol, err_msg=target)
        (report,) = amp.reports
        kept = [d for d in report.decisions if "running sum" in d.reason]
        assert any(d.op == "AddV2" and d.dtype == "float32" for d in kept), kept
        if not lowered:  # the sum is in a branch function: the guard crossed into it
            assert any(d.body for d in kept if d.op == "AddV2"), kept


@pytest.mark.parametrize("lowered", [False, True], ids=["functional", "lowered"])
def test_loop_variables_that_feed_each_other_are_a_running_sum(lowered):
    """``s1, s2 = s2 + x, s1`` sums every other iteration into each variable: a cycle of two
    variables with a sum on it. Unguarded, bfloat16 stopped at 16 where float32 reached
    114.8 (float16 at 112.9)."""
    a, b = _small_products()

    @tf.function
    def head(t):
        return tf.matmul(t, tf.eye(4))

    def swapped(a, b):
        def body(i, s1, s2):
            return i + 1, s2 + tf.matmul(a, b), s1

        zeros = tf.zeros((4, 4))
        total = tf.while_loop(lambda i, s1, s2: i < 5000, body, (0, zeros, zeros))[1]
        return head(total) if lowered else total

    want = tf.function(swapped)(a, b)
    for target, rtol in (("float16", 3e-3), ("bfloat16", 1.5e-2)):
        amp = tf_amp.function(swapped, config=RewriteConfig(target_dtype=target))
        np.testing.assert_allclose(amp(a, b), want, rtol=rtol, err_msg=target)


STACKED_SUMS = {
    "concat of slices": lambda t, x: tf.concat([t[:2] + x[:2], t[2:]], 0),
    "stack of unstacked rows": lambda t, x: tf.stack(
        [row + added for row, added in zip(tf.unstack(t), tf.unstack(x), strict=True)]),
    "transposed twice": lambda t, x: tf.transpose(tf.transpose(t) + tf.transpose(x)),
}


@pytest.mark.parametrize("update", sorted(STACKED_SUMS))
def test_a_running_sum_kept_in_slices_of_a_lowered_loops_variable_keeps_growing(update):
    """A sum through the layout ops (slices, concat, stack, transpose) of a loop lowered by
    inlining: its Merge took the half colour of the slices, and the sum stopped at 9.0 in
    bfloat16 (72.0 in float16) where float32 reached 124.3."""
    a, b = _small_products()
    step = STACKED_SUMS[update]

    @tf.function
    def head(t):
        return tf.matmul(t, tf.eye(4))

    def stacked(a, b):
        def body(i, t):
            return i + 1, step(t, tf.matmul(a, b))

        return head(tf.while_loop(lambda i, t: i < 5000, body, (0, tf.zeros((4, 4))))[1])

    want = tf.function(stacked)(a, b)
    for target, rtol in (("float16", 3e-3), ("bfloat16", 1.5e-2)):
        amp = tf_amp.function(stacked, config=RewriteConfig(target_dtype=target))
        np.testing.assert_allclose(amp(a, b), want, rtol=rtol, err_msg=target)


def test_a_condition_that_does_not_sum_is_left_alone():
    """A branch that replaces the running value (``x - acc``, or a fresh product) makes no
    running sum: nothing is kept float32 for it."""

    def replaced(a, b):
        def body(i, t):
            t = tf.cond(i % 2 < 1, lambda: tf.matmul(a, b) - t, lambda: tf.matmul(a, b))
            return i + 1, t

        return tf.while_loop(lambda i, t: i < 10, body, (0, tf.zeros((4, 4))))[1]

    amp = tf_amp.function(replaced, config=RewriteConfig(target_dtype="float16"))
    amp(*_small_products())
    (report,) = amp.reports
    assert not [d for d in report.decisions if "running sum" in d.reason]


def test_x_minus_the_running_value_is_no_running_sum():
    def alternating(a, b):
        body = lambda i, t: (i + 1, tf.matmul(a, b) - t)  # noqa: E731
        return tf.while_loop(lambda i, t: i < 10, body, (0, tf.zeros((4, 4))))[1]

    amp = tf_amp.function(alternating, config=RewriteConfig(target_dtype="float16"))
    amp(*_small_products())
    (report,) = amp.reports
    assert not [d for d in report.decisions if "running sum" in d.reason]


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_the_sums_are_named_with_the_reason_and_cost_no_cast(loop_inputs, target):
    _, _, guarded = _run(loop_inputs, target_dtype=target)
    _, _, painted = _run(loop_inputs, target_dtype=target, guard_accumulators=False)
    (report,) = guarded.reports
    kept = {("grad" if "_grad_" in d.body else "forward", d.op) for d in report.decisions
            if d.body and "running sum" in d.reason and d.dtype == "float32"
            and d.op in ("AddN", "AddV2")}  # the sums (the Identity nodes around them too)
    # The gradient loop's sum of dL/dw over the iterations; in bfloat16 the forward total
    # too (float16 keeps the Sum that feeds it float32, and so the total, by the lists).
    want = {("grad", "AddN")} | ({("forward", "AddV2")} if target == "bfloat16" else set())
    assert kept == want, [(d.body, d.node, d.reason) for d in report.decisions if d.body]
    (unguarded,) = painted.reports
    assert report.casts_to_half + report.casts_to_float <= (
        unguarded.casts_to_half + unguarded.casts_to_float
    )


def _tf1_running_sum_graph() -> tf.compat.v1.GraphDef:
    graph = tf.Graph()
    with graph.as_default(), v1_control_flow():
        v1 = tf.compat.v1
        x = v1.placeholder(tf.float32, [8, 16], name="x")
        w = tf.constant(np.linspace(-0.2, 0.2, 256, dtype=np.float32).reshape(16, 16))

        def body(i, h, total):
            h = tf.tanh(tf.matmul(h, w))
            return i + 1, h, total + tf.matmul(h, w)

        loop = v1.while_loop(lambda i, h, s: i < 3, body, [tf.constant(0), x, tf.zeros([8, 16])])
        tf.identity(loop[2], name="out")
    return graph.as_graph_def()


def test_a_tf1_loops_running_sum_is_kept_float32():
    graph_def = _tf1_running_sum_graph()
    config = RewriteConfig(target_dtype="float16", preserve_nodes=frozenset({"x", "out"}))
    report = rewrite_graph_def(graph_def, config).report
    adds = [d for d in report.decisions if d.op == "AddV2" and not d.body]
    assert len(adds) == 1 and adds[0].dtype == "float32", adds
    assert "running sum" in adds[0].reason
    off = rewrite_graph_def(graph_def, config.replace(guard_accumulators=False)).report
    (painted,) = [d for d in off.decisions if d.op == "AddV2" and not d.body]
    assert painted.dtype == "float16"  # TensorFlow's pass 4: it follows the half MatMul


def test_the_guard_follows_the_others(monkeypatch):
    """On by default for both targets, off at O3, set by its variable."""
    assert RewriteConfig(target_dtype="float16").guards_accumulators
    assert RewriteConfig(target_dtype="bfloat16").guards_accumulators
    assert not RewriteConfig(target_dtype="float16", opt_level="O3").guards_accumulators
    monkeypatch.setenv("TF_AMP_GUARD_ACCUMULATORS", "0")
    assert not RewriteConfig.from_env(target_dtype="float16").guards_accumulators


def _ema_over_a_dataset(w: tf.Variable):
    def ema_over(ds, decay):
        ema = tf.zeros([4, 16])
        for x in ds:  # AutoGraph: a scan over the dataset, reduced (a dataset loop)
            ema = decay * ema + (1.0 - decay) * (tf.matmul(x, w) + 3.0)
        return ema

    return ema_over


def _clipped_sum_over_a_dataset(w: tf.Variable):
    def clipped_sum(ds, bound):
        total = tf.zeros([4, 16])
        for x in ds:
            total = tf.clip_by_value(total + tf.matmul(x, w) + 1.0, -bound, bound)
        return total

    return clipped_sum


def _ema_under_a_condition(w: tf.Variable):
    def ema_cond(ds, decay):
        ema, i = tf.zeros([4, 16]), tf.constant(0)
        for x in ds:
            if i % 3 > 0:  # a tf.cond: the update is in its branch function
                ema = decay * ema + (1.0 - decay) * (tf.matmul(x, w) + 3.0)
            i += 1
        return ema

    return ema_cond


def _ema_in_an_inner_loop(w: tf.Variable):
    def ema_inner(ds, decay):
        ema = tf.zeros([4, 16])
        for x in ds:
            for _ in tf.range(2):  # a While in the dataset loop's body
                ema = decay * ema + (1.0 - decay) * (tf.matmul(x, w) + 3.0)
        return ema

    return ema_inner


@pytest.mark.parametrize("loop", [_ema_over_a_dataset, _clipped_sum_over_a_dataset,
                                  _ema_under_a_condition, _ema_in_an_inner_loop])
def test_a_dataset_loops_state_stays_float32_whatever_updates_it(loop):
    """TensorFlow's pass leaves a dataset loop's function float32; tf_amp rewrites it for the
    model it runs, and painted its state half when the update was no plain sum: an EMA with a
    tensor decay of 2,000 values came out 60% low in bfloat16, a clipped sum 87% low; under
    an ``if`` or in an inner ``tf.range`` loop, 50% and 54% low."""
    rng = np.random.default_rng(0)
    w = tf.Variable(rng.standard_normal((16, 16)).astype(np.float32) * 0.1)
    xs = rng.standard_normal((2000, 4, 16)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices(xs)
    argument = tf.constant(1e6 if loop is _clipped_sum_over_a_dataset else 0.999)
    want = tf.function(loop(w))(ds, argument)
    amp = tf_amp.function(loop(w), config=RewriteConfig(target_dtype="bfloat16"))
    np.testing.assert_allclose(amp(ds, argument), want, rtol=2e-2)
    (report,) = amp.reports
    assert any(d.op == "MatMul" and d.dtype == "bfloat16" for d in report.decisions)


def test_a_sum_in_a_lowered_inner_loop_keeps_the_outer_loop_float32():
    """Lowered (a nested tf.function call makes tf_amp inline the loops), the outer loop's
    variable ran through the inner loop's Enter and Exit, which the guard did not follow: it
    was painted half and rounded the sum once per outer iteration (54.0 in bfloat16 where
    float32 gives 344.4)."""
    a, b = _small_products()

    @tf.function
    def head(t):
        return tf.matmul(t, tf.eye(4))

    def nested_sum(a, b):
        def outer(i, total):
            inner = lambda j, t: (j + 1, t + tf.matmul(a, b))  # noqa: E731
            return i + 1, tf.while_loop(lambda j, t: j < 3, inner, (0, total))[1]

        return head(tf.while_loop(lambda i, t: i < 2500, outer, (0, tf.zeros((4, 4))))[1])

    want = tf.function(nested_sum)(a, b)
    amp = tf_amp.function(nested_sum, config=RewriteConfig(target_dtype="bfloat16"))
    np.testing.assert_allclose(amp(a, b), want, rtol=1.5e-2)


def test_a_dataset_loop_with_a_deep_body_and_a_recurrent_state():
    """The dataset loop's state is followed through every elementwise op: a walk on Python's
    stack ran past the recursion limit on a body 1,200 ops deep (RecursionError), and the
    state's path took in a recurrent MatMul, which then ran float32."""
    rng = np.random.default_rng(0)
    w = tf.constant(rng.standard_normal((16, 16)).astype(np.float32) * 0.1)
    ds = tf.data.Dataset.from_tensor_slices(rng.standard_normal((20, 4, 16)).astype(np.float32))

    def deep_then_recurrent(ds):
        total, h = tf.zeros([4, 16]), tf.zeros([4, 16])
        for x in ds:
            y = tf.matmul(x, w)
            for _ in range(1200):
                y = tf.sin(y)  # never reads the state: only deep
            h = tf.tanh(tf.matmul(h, w) + x)
            total += y + h
        return total

    amp = tf_amp.function(deep_then_recurrent, config=RewriteConfig(target_dtype="bfloat16"))
    np.testing.assert_allclose(amp(ds), tf.function(deep_then_recurrent)(ds), rtol=5e-2,
                               atol=5e-2)
    (report,) = amp.reports
    matmuls = [d for d in report.decisions if d.op == "MatMul"]
    assert matmuls and all(d.dtype == "bfloat16" for d in matmuls), matmuls
