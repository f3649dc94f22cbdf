"""The Keras 3 LossScaleOptimizer: skip semantics, custom-loop API, save formats, apex extras."""

from __future__ import annotations

import gc
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tests.e2e_helpers import module_with_an_xla_step
from tf_amp.config import local_device_type
from tf_amp.loss_scale import DynamicLossScale, StaticLossScale
from tf_amp.optimizers.keras import KerasLossScaleOptimizer, LossScaleCallback


def tiny_model(seed: int = 0) -> keras.Model:
    """ids(2) -> Embedding(10, 3) -> flatten -> Dense(4) -> Dense(1): dense and sparse grads."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((2,), dtype="int32")
    x = keras.layers.Flatten()(keras.layers.Embedding(10, 3)(inputs))
    x = keras.layers.Dense(4, activation="tanh")(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def data(n: int = 32, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 10, (n, 2)).astype("int32"), rng.normal(size=(n, 1)).astype("float32")


def snapshot(model: keras.Model, opt: KerasLossScaleOptimizer) -> list[np.ndarray]:
    """Weights, every inner-optimizer variable (slots, iterations) — the state a skip keeps."""
    return [np.array(v.numpy()) for v in model.weights + opt.inner_optimizer.variables]


def bit_equal(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def make_step(model: keras.Model, opt: KerasLossScaleOptimizer, x, y):
    """A Keras-3-style custom step; ``bad`` (0, inf or nan) is added to gradient ``which``."""

    @tf.function
    def step(bad: tf.Tensor, which: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        poisoned = []
        for i, g in enumerate(grads):
            add = tf.where(tf.equal(which, i), bad, 0.0)
            if isinstance(g, tf.IndexedSlices):
                poisoned.append(tf.IndexedSlices(g.values + add, g.indices, g.dense_shape))
            else:
                poisoned.append(g + add)
        opt.apply(poisoned, model.trainable_variables)

    return step


def test_embedding_gradient_is_indexed_slices():
    model, (x, y) = tiny_model(), data()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    assert isinstance(tape.gradient(loss, model.trainable_variables)[0], tf.IndexedSlices)


@pytest.mark.parametrize("seed", [0, 1])
def test_skipped_steps_change_nothing_bit_for_bit(seed):
    """inf/nan injected at random steps into random (dense or IndexedSlices) gradients."""
    model, (x, y) = tiny_model(seed), data(seed=seed)
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.Adam(1e-2), DynamicLossScale(initial_scale=2.0**10, growth_interval=4)
    )
    opt.build(model.trainable_variables)
    step = make_step(model, opt, x, y)
    rng = np.random.default_rng(seed)
    n_vars = len(model.trainable_variables)
    injected = 0
    expected_scale = 2.0**10
    good = 0
    for _ in range(24):
        bad = rng.choice([0.0, 0.0, np.inf, -np.inf, np.nan])
        which = int(rng.integers(0, n_vars))
        before = snapshot(model, opt)
        step(tf.constant(bad, tf.float32), tf.constant(which))
        after = snapshot(model, opt)
        if bad != 0.0:  # nan != 0 too
            injected += 1
            good = 0
            expected_scale = max(expected_scale / 2, 1.0)
            assert bit_equal(before, after)
        else:
            good += 1
            if good == 4:
                expected_scale, good = expected_scale * 2, 0
            assert not bit_equal(before[:n_vars], after[:n_vars])
        assert float(opt.loss_scale) == expected_scale
    assert int(opt.skipped_steps) == injected > 0
    assert int(opt.iterations) == 24 - injected


def _apply_or_skip_ifs(graph) -> list:
    return [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]


@pytest.mark.skipif(
    local_device_type() == "GPU", reason="a GPU keeps the lowered If (see below)"
)
def test_apply_or_skip_runs_as_one_function_call_outside_a_strategy():
    """Lowered, the cond would put a Switch on every gradient, variable and slot handle; as
    a call it costs one op (bench/step_overhead.py). The skip semantics above run this form
    on CPU. With a GPU visible the If stays lowered (its branch spans host and device ops)."""
    model, (x, y) = tiny_model(), data()
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(1e-2))
    opt.build(model.trainable_variables)
    step = make_step(model, opt, x, y)
    graph = step.get_concrete_function(tf.constant(0.0), tf.constant(0)).graph
    (cond,) = _apply_or_skip_ifs(graph)
    assert cond.get_attr("_lower_using_switch_merge") is False


@pytest.mark.parametrize("width", [64, 2048])
def test_apply_or_skip_of_a_large_update_stays_lowered(width: int):
    """As a call, the If held every gradient until the whole update was done: on 25M
    parameters it added 40-80 MB to the step's peak memory (the lowered form frees each
    gradient once its variable is updated), for a saving of under 1% of such a step. Updates
    over 16 MiB of gradients stay lowered; 64x64 is kept as a call."""
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(width)])
    x = tf.ones([4, width])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(1e-2))
    opt.build(model.trainable_variables)
    step = make_step(model, opt, x, x)
    graph = step.get_concrete_function(tf.constant(0.0), tf.constant(0)).graph
    (cond,) = _apply_or_skip_ifs(graph)
    lowered = width * (width + 1) * 4 > 16 << 20
    assert lowered == (width == 2048)
    assert cond.get_attr("_lower_using_switch_merge") is (
        lowered or local_device_type() == "GPU"
    )


def test_apply_or_skip_stays_lowered_under_a_strategy():
    """Under a strategy the branch may hold collectives or several devices' ops: TensorFlow's
    tested lowered form is kept."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model, (x, y) = tiny_model(), data()
        opt = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(1e-2))
        opt.build(model.trainable_variables)
    step = make_step(model, opt, x, y)

    @tf.function
    def replicated(bad: tf.Tensor, which: tf.Tensor) -> None:
        strategy.run(step.python_function, args=(bad, which))

    graph = replicated.get_concrete_function(tf.constant(0.0), tf.constant(0)).graph
    (cond,) = _apply_or_skip_ifs(graph)
    assert cond.get_attr("_lower_using_switch_merge") is True
    before = snapshot(model, opt)
    replicated(tf.constant(np.inf), tf.constant(1))
    assert bit_equal(before, snapshot(model, opt))
    assert int(opt.skipped_steps) == 1


def test_fit_save_load_resume_continues_the_same_schedule(tmp_path):
    """save after 2 epochs + load + 2 more == 4 epochs straight: weights, scale, counters.

    4 steps per epoch and growth every 3 steps, so the schedule crosses the save point.
    """
    x, y = data(64)

    def compiled(seed: int) -> keras.Model:
        model = tiny_model(seed)
        opt = tf_amp.LossScaleOptimizer(
            keras.optimizers.Adam(1e-2), DynamicLossScale(initial_scale=4.0, growth_interval=3)
        )
        model.compile(optimizer=opt, loss="mse")
        return model

    straight = compiled(0)
    straight.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)

    first = compiled(0)
    first.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    path = os.path.join(tmp_path, "m.keras")
    first.save(path)
    resumed = keras.models.load_model(path)
    assert isinstance(resumed.optimizer, KerasLossScaleOptimizer)
    assert resumed.optimizer.loss_scale_policy == DynamicLossScale(4.0, growth_interval=3)
    assert float(resumed.optimizer.loss_scale) == float(first.optimizer.loss_scale) == 2.0**4
    assert int(resumed.optimizer.dynamic_counter) == int(first.optimizer.dynamic_counter) == 2
    resumed.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)

    assert float(resumed.optimizer.loss_scale) == float(straight.optimizer.loss_scale) == 2.0**7
    assert int(resumed.optimizer.iterations) == int(straight.optimizer.iterations) == 16
    assert bit_equal([w.numpy() for w in resumed.weights], [w.numpy() for w in straight.weights])


def test_tf_train_checkpoint_round_trip_and_resume(tmp_path):
    model, (x, y) = tiny_model(), data()
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), DynamicLossScale(8.0, growth_interval=2)
    )
    step = make_step(model, opt, x, y)
    zero, nan = tf.constant(0.0), tf.constant(np.nan)
    for bad in (zero, nan, zero, zero, zero):
        step(bad, tf.constant(1))
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    path = ckpt.save(os.path.join(tmp_path, "ckpt"))
    saved = snapshot(model, opt) + [v.numpy() for v in opt._state_vars]
    for bad in (zero, nan, zero):
        step(bad, tf.constant(2))
    continued = snapshot(model, opt) + [v.numpy() for v in opt._state_vars]

    ckpt.restore(path).assert_consumed()
    assert bit_equal(snapshot(model, opt) + [v.numpy() for v in opt._state_vars], saved)
    for bad in (zero, nan, zero):
        step(bad, tf.constant(2))
    assert bit_equal(snapshot(model, opt) + [v.numpy() for v in opt._state_vars], continued)


def test_clipping_on_inner_optimizer_sees_unscaled_gradients():
    """SGD(lr=1, global_clipnorm=1) with a huge scale: the step is the clipped true gradient."""
    w = keras.Variable([3.0, 4.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0, global_clipnorm=1.0), 2.0**20)
    with tf.GradientTape() as tape:
        scaled = opt.scale_loss(tf.reduce_sum(w * w) / 2.0)  # gradient = w, norm 5
    opt.apply(tape.gradient(scaled, [w]), [w])
    np.testing.assert_allclose(w.numpy(), [3.0 - 0.6, 4.0 - 0.8], rtol=1e-6)


def test_gradient_accumulation_skips_a_non_finite_micro_step():
    """With accumulation 2: g1 finite, g2 inf (skipped), g3 finite -> one update by (g1+g3)/2."""
    w = keras.Variable([1.0, 1.0])
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(1.0, gradient_accumulation_steps=2), StaticLossScale(4.0)
    )
    for g in ([0.5, 1.0], [np.inf, 0.0], [1.5, 3.0]):
        opt.apply([tf.constant(g) * 4.0], [w])  # pre-scaled gradients
        if g[0] == 0.5:
            np.testing.assert_array_equal(w.numpy(), [1.0, 1.0])  # accumulated only
    np.testing.assert_array_equal(w.numpy(), [1.0 - 1.0, 1.0 - 2.0])
    assert int(opt.iterations) == 1 and int(opt.skipped_steps) == 1


def test_a_non_finite_gradient_of_an_overwritten_variable_skips_the_step():
    """A float8 layer's amax history is overwritten with its gradient, so it is not unscaled;
    it was left out of the finite check too, and its inf was written in while the step ran.
    Keras's own wrapper skips such a step; so does this one."""
    for ours, make in (
        (True, lambda inner: tf_amp.LossScaleOptimizer(inner, "dynamic")),
        (False, lambda inner: keras.optimizers.LossScaleOptimizer(inner, initial_scale=4.0)),
    ):
        opt = make(keras.optimizers.SGD(0.1))
        w = keras.Variable(np.array([1.0], np.float32), name="w")
        amax = keras.Variable(np.array([5.0], np.float32), name="amax_history")
        amax.overwrite_with_gradient = True  # what Dense.quantize("float8") sets
        opt.apply([tf.constant([4.0]), tf.constant([np.inf])], [w, amax])
        assert (w.numpy()[0], amax.numpy()[0], int(opt.iterations)) == (1.0, 5.0, 0), ours
        if ours:  # Keras's own wrapper below 3.10 unscales it, and counts on its own
            opt.apply([tf.constant([4.0]), tf.constant([7.0])], [w, amax])
            assert amax.numpy()[0] == 7.0  # written as it is: not unscaled
            assert int(opt.iterations) == 1


def test_tf2_guide_recipe_matches_keras3_recipe():
    """get_scaled_loss + get_unscaled_gradients + apply_gradients == scale_loss + apply."""
    results = []
    for recipe in ("tf2", "keras3"):
        model, (x, y) = tiny_model(), data()
        opt = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(1e-2))
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
                scaled = (opt.get_scaled_loss if recipe == "tf2" else opt.scale_loss)(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            if recipe == "tf2":
                grads = opt.get_unscaled_gradients(grads)
                opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            else:
                opt.apply(grads, model.trainable_variables)
        results.append([w.numpy() for w in model.weights])
    assert bit_equal(*results)


def test_unscaling_twice_in_one_step_is_an_error():
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD())
    opt.get_unscaled_gradients([tf.ones(2)])
    with pytest.raises(RuntimeError, match="unscaled twice"):
        opt.get_unscaled_gradients([tf.ones(2)])


def test_get_unscaled_gradients_then_non_finite_still_skips():
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0), 8.0)
    grads = opt.get_unscaled_gradients([tf.constant([np.nan])])
    opt.apply_gradients(zip(grads, [w], strict=True))
    assert w.numpy()[0] == 1.0 and int(opt.skipped_steps) == 1


def _sgd_step(opt, w):
    """One Keras-3-style step on loss sum(2w): the true gradient is 2 per element."""
    with tf.GradientTape() as tape:
        scaled = opt.scale_loss(tf.reduce_sum(w * 2.0))
    opt.apply(tape.gradient(scaled, [w]), [w])


def test_abandoned_get_unscaled_gradients_does_not_reach_the_next_step():
    """get_unscaled_gradients, then an exception the user catches: the next step still unscales."""
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.5), 2.0**15)
    try:
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(tf.reduce_sum(w * 2.0))
        opt.get_unscaled_gradients(tape.gradient(scaled, [w]))
        raise KeyError("user code failed before apply_gradients")
    except KeyError:
        pass
    _sgd_step(opt, w)
    np.testing.assert_array_equal(w.numpy(), [0.0])  # 1 - 0.5 * 2, not 1 - 0.5 * 2 * 2**15
    # The abandoned unscale does not count against the next one either.
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(tf.reduce_sum(w * 2.0))
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, [w]))
    opt.apply_gradients(zip(grads, [w], strict=True))
    np.testing.assert_array_equal(w.numpy(), [-1.0])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_unscaling_only_to_log_leaves_apply_unscaling_the_scaled_gradients(traced):
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.5), 2.0**15)
    logged = []

    def step():
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(tf.reduce_sum(w * 2.0))
        grads = tape.gradient(scaled, [w])
        logged.append(tf.identity(opt.get_unscaled_gradients(grads)[0]))  # a look, nothing more
        opt.apply(grads, [w])
        return logged[-1]

    seen = (tf.function(step) if traced else step)()
    np.testing.assert_array_equal(seen.numpy(), [2.0])
    np.testing.assert_array_equal(w.numpy(), [0.0])
    _sgd_step(opt, w)
    np.testing.assert_array_equal(w.numpy(), [-1.0])


def test_unscaled_gradients_of_one_thread_are_not_another_threads():
    """Replica threads (MirroredStrategy) each have their own step."""
    import threading

    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.5), 2.0**15)
    opt.build([w])
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(tf.reduce_sum(w * 0.0))
    mine = opt.get_unscaled_gradients(tape.gradient(scaled, [w]))  # this thread's step is open
    errors = []

    def other_thread():
        try:
            _sgd_step(opt, w)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert not errors, errors
    np.testing.assert_array_equal(w.numpy(), [0.0])
    opt.apply_gradients(zip(mine, [w], strict=True))  # this thread's step, still unscaled
    np.testing.assert_array_equal(w.numpy(), [0.0])


def _tf2_guide_grads(opt, v):
    """TF2-guide-style gradients of sum(v**2), unscaled: 2v."""
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(tf.reduce_sum(v**2))
    return opt.get_unscaled_gradients(tape.gradient(scaled, [v]))


def test_gradients_unscaled_in_a_loop_body_are_not_unscaled_again_after_the_loop():
    """In-graph accumulation: get_unscaled_gradients in a tf.range body, apply after it."""
    v = keras.Variable([1.0, 2.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), 1024.0)

    @tf.function
    def step():
        total = tf.zeros_like(v)
        for _ in tf.range(2):
            (g,) = _tf2_guide_grads(opt, v)
            total += g / 2.0
        opt.apply_gradients([(total, v)])

    expected = np.array([1.0, 2.0])
    for _ in range(3):
        step()
        expected = expected - 0.1 * 2 * expected
        np.testing.assert_allclose(v.numpy(), expected, rtol=1e-6)


def test_gradients_unscaled_eagerly_are_not_unscaled_again_by_a_traced_apply():
    v = keras.Variable([1.0, 2.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), 1024.0)
    apply = tf.function(lambda grads: opt.apply_gradients(zip(grads, [v], strict=True)))
    expected = np.array([1.0, 2.0])
    for _ in range(3):
        apply(_tf2_guide_grads(opt, v))
        expected = expected - 0.1 * 2 * expected
        np.testing.assert_allclose(v.numpy(), expected, rtol=1e-6)


def test_an_eager_look_at_unscaled_gradients_does_not_reach_a_traced_step():
    """Unscaled eagerly only to be looked at, then a traced Keras-style step: its own
    scale_loss starts a new step, so its apply unscales."""
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.5), 2.0**15)
    opt.build([w])
    with tf.GradientTape() as tape:
        scaled = opt.scale_loss(tf.reduce_sum(w * 2.0))
    opt.get_unscaled_gradients(tape.gradient(scaled, [w]))  # a look, nothing more
    tf.function(lambda: _sgd_step(opt, w))()
    np.testing.assert_array_equal(w.numpy(), [0.0])  # 1 - 0.5 * 2, not 1 - 0.5 * 2 * 2**15


def test_gradients_unscaled_in_another_traced_function_are_a_clear_error():
    """Later calls of the traced function run no Python: the unscale would be invisible."""
    v = keras.Variable([1.0, 2.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), 1024.0)
    grads = tf.function(lambda: _tf2_guide_grads(opt, v))()
    with pytest.raises(ValueError, match="same tf.function"):
        opt.apply_gradients(zip(grads, [v], strict=True))
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])


def test_apply_refuses_a_mix_of_scaled_and_unscaled_gradients():
    w, v = keras.Variable([1.0]), keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.5), 8.0)
    scaled = [tf.constant([8.0]), tf.constant([8.0])]
    unscaled = opt.get_unscaled_gradients(scaled)
    with pytest.raises(ValueError, match="pass the unscaled ones only"):
        opt.apply([unscaled[0], scaled[1]], [w, v])


@pytest.mark.parametrize("where", ["eager", "tf_function", "cond_branch"])
def test_gradients_clipped_between_unscale_and_apply_are_not_unscaled_again(where):
    w = keras.Variable([3.0, 4.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0), 2.0**20)
    opt.build([w])

    def step():
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(tf.reduce_sum(w * w) / 2.0)  # gradient = w, norm 5
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, [w]))
        clipped, _ = tf.clip_by_global_norm(grads, 1.0)
        if where != "cond_branch":
            opt.apply_gradients(zip(clipped, [w], strict=True))
            return

        def apply_branch():
            opt.apply_gradients(zip(clipped, [w], strict=True))
            return tf.constant(True)

        tf.cond(tf.constant(True), apply_branch, lambda: tf.constant(False))

    (step if where == "eager" else tf.function(step))()
    np.testing.assert_allclose(w.numpy(), [3.0 - 0.6, 4.0 - 0.8], rtol=1e-6)


def test_enabled_false_is_the_inner_optimizer():
    runs = []
    for enabled in (True, False, None):
        w = keras.Variable([1.0, -2.0])
        inner = keras.optimizers.Adam(0.1)
        opt = inner if enabled is None else tf_amp.LossScaleOptimizer(inner, enabled=enabled)
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = opt.scale_loss(tf.reduce_sum(w * w))
            opt.apply(tape.gradient(loss, [w]), [w])
        runs.append(w.numpy())
    np.testing.assert_array_equal(runs[1], runs[2])
    disabled = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), enabled=False)
    assert float(disabled.scale_loss(tf.constant(3.0))) == 3.0
    assert float(disabled.loss_scale) == 1.0
    # what it does, not the policy it would use if enabled (which the config keeps)
    assert (disabled.dynamic, disabled.initial_scale, disabled.dynamic_growth_steps) == (
        False, 1.0, None
    )
    assert disabled.dynamic_counter is None and disabled.loss_scale_policy.dynamic
    # and it round-trips through get_config
    restored = KerasLossScaleOptimizer.from_config(disabled.get_config())
    assert restored.enabled is False and float(restored.loss_scale) == 1.0
    assert restored.loss_scale_policy == disabled.loss_scale_policy


def test_static_scale_is_settable_and_counts_skips():
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0), loss_scale=128)
    assert not opt.dynamic and float(opt.loss_scale) == 128.0
    opt.apply([tf.constant([np.inf])], [w])
    assert float(opt.loss_scale) == 128.0 and int(opt.skipped_steps) == 1
    opt.loss_scale = 64.0
    opt.apply([tf.constant([64.0])], [w])
    assert float(opt.loss_scale) == 64.0 and w.numpy()[0] == 0.0


def test_exclude_from_weight_decay_reaches_the_inner_optimizer():
    """The inner AdamW decays; exclusions made through the wrapper must reach it."""
    bias, kernel = keras.Variable([1.0], name="bias"), keras.Variable([1.0], name="kernel")
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.AdamW(0.1, weight_decay=0.5), 1.0)
    opt.exclude_from_weight_decay(var_names=["bias"])
    opt.apply([tf.constant([0.0]), tf.constant([0.0])], [bias, kernel])
    assert bias.numpy()[0] == 1.0  # excluded: a zero gradient leaves it
    assert kernel.numpy()[0] == pytest.approx(0.95)  # decayed by lr * weight_decay


def test_keras3_names_of_the_scale_variables():
    """Code written for keras.optimizers.LossScaleOptimizer reads and assigns these."""
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), DynamicLossScale(8.0))
    opt.apply([tf.constant([8.0])], [w])
    assert float(opt.dynamic_scale) == 8.0 and int(opt.step_counter) == 1
    opt.dynamic_scale.assign(2.0)
    assert float(opt.loss_scale) == 2.0


def test_two_optimizers_keep_their_own_scales():
    """GAN-style: generator and discriminator optimizers skip and back off independently."""
    g_w, d_w = keras.Variable([1.0]), keras.Variable([1.0])
    g_opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), DynamicLossScale(16.0))
    d_opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), DynamicLossScale(16.0))
    g_opt.apply([tf.constant([np.inf])], [g_w])
    d_opt.apply([tf.constant([16.0])], [d_w])
    assert float(g_opt.loss_scale) == 8.0 and float(d_opt.loss_scale) == 16.0
    assert g_w.numpy()[0] == 1.0 and d_w.numpy()[0] == pytest.approx(0.9)


def test_floor_warning_once_and_raise_after_consecutive_skips(capfd):
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(), DynamicLossScale(initial_scale=2.0), max_consecutive_skips=6
    )
    step = tf.function(lambda: opt.apply([tf.constant([np.nan])], [w]))
    for _ in range(5):
        step()
    err = capfd.readouterr().err
    assert err.count("loss scale is at its floor") == 1, err
    # at the floor the loss is not scaled up: the message names both remaining causes (an
    # earlier version asserted it called every such step "not a float16 overflow", which is
    # false for gradients that overflow float16 even unscaled; issue 15)
    assert "exceeds float16's range" in err and "float32 too" in err
    with pytest.raises(tf.errors.InvalidArgumentError, match="6 consecutive steps were skipped"):
        step()


def _floor_run(jit_compile: bool, check_every: int = 1) -> list[str]:
    """From scale 4: five skips (down to the floor 1), a finite step (up to 2), six skips;
    what the alarm says, and the step it raises on. Under XLA the checks run on the host
    (``check_skips``), after every ``check_every`` steps."""
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(0.1),
        DynamicLossScale(initial_scale=4.0, growth_interval=1),
        max_consecutive_skips=6,
    )
    step = tf.function(lambda g: opt.apply([g], [w]), jit_compile=jit_compile)
    said = []
    values = [np.inf] * 5 + [1.0, np.nan, np.inf, np.nan, np.nan, np.inf, np.nan]
    for i, value in enumerate(values):
        try:
            step(tf.constant([value]))
            if jit_compile and (i + 1) % check_every == 0:
                opt.check_skips()
        except tf.errors.InvalidArgumentError as error:
            words = re.search(r"\d+ consecutive steps were skipped", str(error))
            said.append(f"step {i}: {words.group() if words else error}")
            break
    return said


def test_floor_checks_of_an_xla_step_run_on_the_host_with_the_same_words(
    capfd, caplog, monkeypatch
):
    """XLA compiles no print or assert: the trace says so, and check_skips() says on the host
    what the step says in a graph XLA does not compile, on the same steps."""
    from tf_amp import _say_once

    monkeypatch.setattr(_say_once, "_SAID", set())  # lines said once per process
    in_graph = _floor_run(jit_compile=False)
    graph_err = capfd.readouterr().err
    with caplog.at_level("WARNING", logger="tf_amp"):
        on_host = _floor_run(jit_compile=True)
    host_err = capfd.readouterr().err
    assert in_graph == on_host == ["step 11: 6 consecutive steps were skipped"]
    warnings = [line for line in graph_err.splitlines() if line.startswith("WARNING tf_amp")]
    assert [line for line in host_err.splitlines() if line.startswith("WARNING tf_amp")] == (
        warnings
    )
    # fell to the floor (4 -> 2 -> 1, then 2 -> 1), stuck at it once per run of skips
    assert [w.split(" the loss scale ")[1][:16] for w in warnings] == [
        "fell to its floo", "is at its floor ", "fell to its floo", "is at its floor "
    ]
    assert "compiled with XLA" in caplog.text and "LossScaleCallback" in caplog.text


def test_host_checks_every_few_xla_steps_miss_nothing_in_between(capfd):
    """Checked every 4 steps, the host says each warning the steps would have said (counted
    inside them), and raises at the check after the step that reached max_consecutive_skips.
    Reading only the state at each check would have missed the first run's warnings: a
    finite step ends it between two checks."""
    _floor_run(jit_compile=False)
    warnings = [line for line in capfd.readouterr().err.splitlines()
                if line.startswith("WARNING tf_amp")]
    said = _floor_run(jit_compile=True, check_every=4)
    host = [line for line in capfd.readouterr().err.splitlines()
            if line.startswith("WARNING tf_amp")]
    assert said == ["step 11: 6 consecutive steps were skipped"]  # checked after step 11
    assert host == warnings and len(host) == 4


def _skip_runs_then_a_finite_batch(jit_compile: bool, **compile_args: object) -> None:
    """fit over batches bad, bad, bad, good (twice), 4 steps per execution, with
    max_consecutive_skips=3: the third skip of a run must raise, though the fourth batch of
    the same execution is finite and resets the count before any host check."""
    x, y = np.ones((32, 1), "float32"), np.ones((32, 1), "float32")
    x[[i for i in range(32) if (i // 4) % 4 != 3]] = np.inf
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), DynamicLossScale(initial_scale=4.0), max_consecutive_skips=3
    )
    model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile, **compile_args)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[LossScaleCallback()])


@pytest.mark.parametrize("jit_compile", [False, True])
def test_max_consecutive_skips_is_enforced_with_several_steps_per_execution(jit_compile):
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 consecutive steps"):
        _skip_runs_then_a_finite_batch(jit_compile, steps_per_execution=4)


def test_loss_scale_callback_checks_a_train_step_the_user_compiles_with_xla():
    """model.jit_compile is off; the train step compiles its own XLA function. The callback
    still checks on the host (it used to look at model.jit_compile only)."""

    class OwnXlaStep(keras.Model):
        @tf.function(jit_compile=True)
        def _step(self, x, y):  # noqa: ANN001, ANN202
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
                scaled = self.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            return loss

        def train_step(self, data):  # noqa: ANN001, ANN201
            x, y = data
            return {"loss": self._step(x, y)}

    x, y = np.full((32, 1), np.inf, "float32"), np.ones((32, 1), "float32")
    inputs = keras.Input((1,))
    model = OwnXlaStep(inputs, keras.layers.Dense(1)(inputs))
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), DynamicLossScale(initial_scale=4.0), max_consecutive_skips=3
    )
    model.compile(optimizer=opt, jit_compile=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 consecutive steps"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[LossScaleCallback()])
    assert 3 <= int(opt.skipped_steps) <= 5


def test_a_module_with_an_xla_step_exports_and_checkpoints_keep_their_keys(tmp_path):
    """The XLA step captures the floor-event counts: tf.saved_model.save must reach them
    (it refused an 'untracked' resource), while checkpoints leave them out."""
    w = tf.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), max_consecutive_skips=5)
    trainer = module_with_an_xla_step(opt, w, lambda o, g, v: o.apply([g], [v]))
    with pytest.warns(UserWarning, match="not scaled"):
        trainer.train(tf.constant([np.inf]))
    tf.saved_model.save(trainer, str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    np.testing.assert_array_equal(loaded.train(tf.constant([np.inf])).numpy(), [1.0])
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "c"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any("loss_scale" in name for name in names)
    assert not any("floor_events" in name for name in names)


def test_loss_scale_callback_enforces_max_consecutive_skips_in_a_jit_compiled_fit():
    _, y = data()
    x_bad = np.full_like(y, np.inf)  # every step's gradients are inf
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), DynamicLossScale(initial_scale=4.0), max_consecutive_skips=3
    )
    model.compile(optimizer=opt, loss="mse", jit_compile=True)
    model.fit(x_bad, y, batch_size=4, epochs=1, verbose=0)  # no check: XLA has none
    assert int(opt.skipped_steps) == 8
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), DynamicLossScale(initial_scale=4.0), max_consecutive_skips=3
    )
    model.compile(optimizer=opt, loss="mse", jit_compile=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="3 consecutive steps"):
        model.fit(
            x_bad, y, batch_size=4, epochs=1, verbose=0, callbacks=[LossScaleCallback()]
        )
    # raised at the third skip, or a batch later (Keras may run the hook in a thread), not
    # at the end of the epoch's 8 batches
    assert 3 <= int(opt.skipped_steps) <= 5


def test_scale_and_skips_as_summaries_and_fit_logs(tmp_path):
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), DynamicLossScale(8.0))
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        opt.apply([tf.constant([np.inf])], [w])
        opt.apply([tf.constant([1.0])], [w])
    writer.flush()
    seen: dict[str, list[float]] = {}
    for name in os.listdir(tmp_path):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(tmp_path, name)):
            for value in event.summary.value:
                seen.setdefault(value.tag, []).append(float(tf.make_ndarray(value.tensor)))
    assert seen["tf_amp/loss_scale"] == [4.0, 4.0]
    assert seen["tf_amp/skipped_steps"] == [1.0, 1.0]

    model, (x, y) = tiny_model(), data()
    model.compile(optimizer=tf_amp.LossScaleOptimizer(keras.optimizers.Adam()), loss="mse")
    history = model.fit(x, y, epochs=1, verbose=0, callbacks=[LossScaleCallback()])
    assert history.history["loss_scale"] == [2.0**15]
    assert history.history["skipped_steps"] == [0.0]


def _written_steps(logdir) -> dict[str, list[tuple[int, float]]]:
    seen: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(logdir)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(logdir, name)):
            for value in event.summary.value:
                written = float(tf.make_ndarray(value.tensor))
                seen.setdefault(value.tag, []).append((event.step, written))
    return seen


@pytest.mark.parametrize("user_step", [None, "python", "variable"])
def test_every_apply_writes_its_summaries_at_a_step_of_its_own(tmp_path, user_step):
    """A skipped step leaves ``iterations`` alone: written at ``iterations``, it landed on the
    applied step's step before it. A user's step variable is taken as it is; a Python number
    set before tracing would be frozen in the trace, so the count of calls is used instead."""
    w = keras.Variable([1.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), DynamicLossScale(8.0))
    step_var = tf.Variable(100, dtype=tf.int64)

    @tf.function
    def apply(grad):
        opt.apply([grad], [w])
        if user_step == "variable":
            step_var.assign_add(1)

    writer = tf.summary.create_file_writer(str(tmp_path))
    step = {"python": 7, "variable": step_var}.get(user_step)
    with writer.as_default(step=step):
        for grad in ([1.0], [np.inf], [1.0], [np.inf], [1.0]):
            apply(tf.constant(grad))
    writer.flush()
    steps = [step for step, _ in _written_steps(tmp_path)["tf_amp/skipped_steps"]]
    if user_step == "variable":
        assert steps == [100, 101, 102, 103, 104]
    else:
        assert steps == [1, 2, 3, 4, 5]


def test_wrapping_errors_say_what_to_pass():
    wrapped = tf_amp.LossScaleOptimizer(keras.optimizers.Adam())
    with pytest.raises(ValueError, match="already a tf_amp LossScaleOptimizer"):
        tf_amp.LossScaleOptimizer(wrapped)
    with pytest.raises(ValueError, match="pass its `inner_optimizer`"):
        tf_amp.LossScaleOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
    with pytest.raises(TypeError, match="pass a Keras 3 optimizer"):
        tf_amp.LossScaleOptimizer("adam")
    with pytest.raises(TypeError, match="build it first"):
        tf_amp.LossScaleOptimizer("adam")
    with pytest.raises(ValueError, match="set `clipnorm` on the inner optimizer"):
        KerasLossScaleOptimizer(keras.optimizers.Adam(), clipnorm=1.0)
    with pytest.raises(ValueError, match="pass loss_scale=128.0"):
        tf_amp.LossScaleOptimizer(keras.optimizers.Adam(loss_scale_factor=128.0))


def test_enable_mixed_precision_graph_rewrite_marks_and_toggles():
    from tf_amp.enable import is_rewrite_enabled, optimizer_wants_rewrite

    try:
        opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(), 256)
        assert isinstance(opt, KerasLossScaleOptimizer) and opt._tf_amp_graph_rewrite is True
        assert optimizer_wants_rewrite(opt) and is_rewrite_enabled()
        assert float(opt.loss_scale) == 256.0
        with pytest.raises(ValueError, match="already a tf_amp"):
            tf_amp.enable_mixed_precision_graph_rewrite(opt)
        with pytest.raises(TypeError, match="tf.compat.v1.train.Optimizer"):
            tf_amp.enable_mixed_precision_graph_rewrite(object())
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
    assert not is_rewrite_enabled()


FALLBACK_SCRIPT = """
import json
import numpy as np, tensorflow as tf, keras, tf_amp
from tf_amp.loss_scale import DynamicLossScale
w, emb = keras.Variable([0.5, -1.0, 2.0]), keras.Variable(np.ones((4, 2), np.float32))
policy = DynamicLossScale(8.0, growth_interval=2)
opt = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(0.1), policy)
for i, bad in enumerate([0.0, np.inf, 0.0, 0.0, np.nan, 0.0, 0.0]):
    scale = float(opt.loss_scale)
    dense = tf.constant([0.3, -0.2, 0.1 + bad]) * scale
    rows = tf.constant([[0.25, 1.0]]) * scale
    sparse = tf.IndexedSlices(rows, tf.constant([i % 4]), tf.constant([4, 2]))
    opt.apply([dense, sparse], [w, emb])
print(json.dumps({"native": tf_amp.native_op_available(), "skipped": int(opt.skipped_steps),
                  "scale": float(opt.loss_scale),
                  "weights": [v.numpy().tobytes().hex() for v in (w, emb)]}))
"""


def test_fallback_op_path_gives_the_same_training_as_the_default_path():
    """TF_AMP_FORCE_FALLBACK_OP=1 takes the pure-TF op; results are bit-identical either way."""
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = {}
    for forced in ("1", "0"):
        env = dict(os.environ, PYTHONPATH=root, TF_AMP_FORCE_FALLBACK_OP=forced)
        done = subprocess.run(
            [sys.executable, "-c", FALLBACK_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[forced] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs["1"]["native"] is False
    assert runs["1"]["skipped"] == 2 and runs["1"]["scale"] == 8.0  # 8 4 4 8 4 4 8
    assert runs["1"] == dict(runs["0"], native=False)


def test_jit_compiled_fit_uses_the_tf_path_and_still_skips():
    """Under jit_compile the native kernel (no XLA translation) is replaced by TF ops."""
    x, y = np.ones((16, 3), np.float32), np.ones((16, 1), np.float32)
    for scale, skipped in ((2.0**10, 0), (float(np.finfo(np.float32).max), 4)):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        initial = [w.numpy().copy() for w in model.weights]
        opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), StaticLossScale(scale))
        model.compile(optimizer=opt, loss="mse", jit_compile=True)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert int(opt.skipped_steps) == skipped and int(opt.iterations) == 4 - skipped
        unchanged = all(
            a.tobytes() == w.numpy().tobytes() for a, w in zip(initial, model.weights, strict=True)
        )
        assert unchanged == (skipped == 4)


def test_mixed_float16_policy_does_not_wrap_it_a_second_time():
    """compile() under mixed_float16 wraps optimizers that are not loss-scale optimizers."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), 2.0**4)
        model.compile(optimizer=opt, loss="mse")
        assert model.optimizer is opt
        model.fit(np.ones((8, 3), "float32"), np.zeros((8, 1), "float32"), verbose=0)
        assert int(opt.iterations) == 1 and float(opt.loss_scale) == 16.0
    finally:
        keras.config.set_dtype_policy(previous)


def test_fit_with_a_growing_scale_trains_exactly_like_the_inner_optimizer():
    """Power-of-two scales make scaling exact: the scale doubling every step must not show."""
    weights = []
    for wrap in (False, True):
        model, (x, y) = tiny_model(), data()
        opt = keras.optimizers.SGD(0.1)
        if wrap:
            opt = tf_amp.LossScaleOptimizer(opt, DynamicLossScale(2.0, growth_interval=1))
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        weights.append([w.numpy() for w in model.weights])
    assert float(opt.loss_scale) == 2.0**5
    assert bit_equal(*weights)


def test_checkpoint_restores_into_a_fresh_unbuilt_wrapper(tmp_path):
    """The custom-loop resume: restore() before the first step, state arrives on build."""

    def make():
        model = tiny_model()
        opt = tf_amp.LossScaleOptimizer(
            keras.optimizers.Adam(0.1), DynamicLossScale(8.0, growth_interval=2)
        )
        return model, opt, make_step(model, opt, *data())

    model, opt, step = make()
    for bad in (0.0, np.inf, 0.0, 0.0, 0.0):
        step(tf.constant(bad), tf.constant(2))
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(os.path.join(tmp_path, "c"))
    assert (float(opt.loss_scale), int(opt.dynamic_counter), int(opt.skipped_steps)) == (8, 1, 1)

    model2, opt2, step2 = make()
    status = tf.train.Checkpoint(model=model2, optimizer=opt2).restore(path)
    step2(tf.constant(np.inf), tf.constant(2))  # builds the optimizer: deferred restore lands
    status.assert_consumed()
    assert (float(opt2.loss_scale), int(opt2.skipped_steps), int(opt2.iterations)) == (4.0, 2, 4)
    assert bit_equal(snapshot(model2, opt2), snapshot(model, opt))


@pytest.mark.parametrize("built", [False, True])
def test_a_keras3_loss_scale_optimizer_checkpoint_restores_into_the_wrapper(tmp_path, built):
    """Keras 3's wrapper writes its own layout (its unused iterations and a variable list at
    its node, the inner optimizer under inner_optimizer): its names overlap ours, and read as
    ours they reset iterations and fed an int64 counter to a float32 slot (RestoreV2 error)."""
    w_keras = tf.Variable([1.0, -2.0])
    theirs = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.1), initial_scale=8.0, dynamic_growth_steps=2
    )
    for _ in range(3):  # the scale grows after two finite steps; one more step is counted
        with tf.GradientTape() as tape:
            loss = theirs.scale_loss(tf.reduce_sum(w_keras**2))
        theirs.apply(tape.gradient(loss, [w_keras]), [w_keras])
    path = tf.train.Checkpoint(optimizer=theirs, w=w_keras).save(str(tmp_path / "keras"))

    w = tf.Variable([0.0, 0.0])
    ours = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(0.1), DynamicLossScale(8.0, 2))
    if built:
        ours.build([w])
    status = tf.train.Checkpoint(optimizer=ours, w=w).restore(path)
    if not built:
        ours.build([w])
    gc.collect()  # the stand-ins for Keras's unused entries must outlive the restore
    # assert_consumed(): only our three skip counters (Keras's wrapper has none) are left...
    with pytest.raises(AssertionError, match="Found 3 Python objects") as unmatched:
        status.assert_consumed()
    for field in ("skipped_steps", "consecutive_skips", "floor_skips"):
        assert f"loss_scale_{field}" in str(unmatched.value)
    # ...and its next check, which that error stops: every saved value found its object.
    coordinator = status._checkpoint  # noqa: SLF001
    assert not [
        i
        for i, node in enumerate(coordinator.object_graph_proto.nodes)
        if node.attributes and coordinator.object_by_proto_id.get(i) is None
    ]
    assert int(ours.iterations) == 3 and float(ours.loss_scale) == 16.0
    assert int(ours.dynamic_counter) == 1 and int(ours.skipped_steps) == 0
    for mine, keras_variable in zip(
        ours.inner_optimizer.variables, theirs.inner_optimizer.variables, strict=True
    ):
        np.testing.assert_array_equal(mine.numpy(), keras_variable.numpy())
    for optimizer, variable in ((theirs, w_keras), (ours, w)):  # and they go on alike
        with tf.GradientTape() as tape:
            loss = optimizer.scale_loss(tf.reduce_sum(variable**2))
        optimizer.apply(tape.gradient(loss, [variable]), [variable])
    np.testing.assert_array_equal(w.numpy(), w_keras.numpy())
    assert float(ours.loss_scale) == float(theirs.dynamic_scale) == 32.0


def test_accepts_the_argument_names_of_the_tf2_and_keras_wrappers():
    opt = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=2.0**10, dynamic_growth_steps=50
    )
    assert opt.loss_scale_policy == DynamicLossScale(2.0**10, growth_interval=50)
    static = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False, initial_scale=64)
    assert static.loss_scale_policy == StaticLossScale(64.0)
    with pytest.raises(ValueError, match="not both"):
        tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), 128, initial_scale=2.0)
    # TF2's signature defaults both to None, meaning "the default".
    default = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(), dynamic=True, initial_scale=None, dynamic_growth_steps=None
    )
    assert default.loss_scale_policy == DynamicLossScale(2.0**15, growth_interval=2000)
    static_default = tf_amp.LossScaleOptimizer(
        keras.optimizers.SGD(), dynamic=False, initial_scale=None, dynamic_growth_steps=None
    )
    assert static_default.loss_scale_policy == StaticLossScale(2.0**15)


@pytest.mark.parametrize(
    "imports",
    [
        "import keras, tf_amp.optimizers",
        # Registered only when Keras was imported before tf_amp.optimizers, which `import
        # tf_amp` does not import: "Could not locate class 'KerasLossScaleOptimizer'".
        "import tf_amp, keras",
        "import tf_amp, tensorflow as tf; keras = tf.keras",
    ],
)
def test_saved_file_loads_in_a_fresh_process(tmp_path, imports):
    """load_model finds the wrapper class wherever tf_amp is imported, before or after Keras."""
    import subprocess
    import sys

    model, (x, y) = tiny_model(), data()
    model.compile(optimizer=tf_amp.LossScaleOptimizer(keras.optimizers.Adam(), 512), loss="mse")
    model.fit(x, y, verbose=0)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        f"{imports}\n"
        f"m = keras.models.load_model({path!r})\n"
        "print(type(m.optimizer).__name__, float(m.optimizer.loss_scale))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=root),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["KerasLossScaleOptimizer", "512.0"]
