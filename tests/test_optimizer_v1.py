"""The tf.compat.v1.train LossScaleOptimizer in a TF1 Session and in tf.function."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tf_amp.loss_scale import DynamicLossScale
from tf_amp.optimizers.v1 import V1LossScaleOptimizer

v1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_graph(loss_scale, inner=None, **wrapper_kwargs):
    """x(4x3) -> matmul w(3x2) -> gather rows of emb(5x2) -> loss * poison.

    ``poison`` (a placeholder, default 1) turns the loss, and so every gradient, into inf/nan.
    ``emb`` is read through tf.gather, so its gradient is an IndexedSlices.
    """
    x = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0)
    poison = v1.placeholder_with_default(tf.constant(1.0), [])
    w = v1.get_variable("w", initializer=tf.constant([[0.1, 0.2], [0.3, -0.1], [0.0, 0.5]]))
    emb = v1.get_variable("emb", initializer=tf.ones([5, 2]))
    h = tf.matmul(x, w) * tf.gather(emb, [0, 2, 2, 4])
    loss = tf.reduce_mean(tf.square(h - 1.0)) * poison
    step = v1.train.get_or_create_global_step()
    opt = tf_amp.LossScaleOptimizer(
        inner or v1.train.AdamOptimizer(0.05), loss_scale, **wrapper_kwargs
    )
    train = opt.minimize(loss, global_step=step)
    return opt, train, poison, step


def session_state(sess, opt):
    """Every variable except the loss-scale state: weights, slots, beta powers, global_step."""
    own = {v.name for v in opt._state_vars}
    variables = sorted(
        (v for v in v1.global_variables() if v.name not in own), key=lambda v: v.name
    )
    return [v.name for v in variables], [value.tobytes() for value in sess.run(variables)]


def test_session_skip_semantics_with_injected_inf_and_nan():
    rng = np.random.default_rng(3)
    with tf.Graph().as_default():
        opt, train, poison, step = build_graph(DynamicLossScale(2.0**8, growth_interval=3))
        assert isinstance(opt, V1LossScaleOptimizer)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            names, _ = session_state(sess, opt)
            assert {"w/Adam:0", "emb/Adam:0", "beta1_power:0", "global_step:0"} <= set(names)
            injected = 0
            for _ in range(20):
                bad = rng.choice([1.0, 1.0, np.inf, np.nan])
                _, before = session_state(sess, opt)
                sess.run(train, {poison: bad})
                _, after = session_state(sess, opt)
                if bad == 1.0:
                    assert before != after
                else:
                    injected += 1
                    assert before == after  # bit-identical, global_step included
            assert sess.run(opt.skipped_steps) == injected > 0
            assert sess.run(step) == 20 - injected


def test_compute_gradients_are_unscaled_and_indexed_slices_kept():
    with tf.Graph().as_default():
        x = tf.constant([[1.0, 2.0]])
        w = v1.get_variable("w", initializer=tf.constant([[0.5], [0.25]]))
        emb = v1.get_variable("emb", initializer=tf.ones([3, 1]))
        loss = tf.reduce_sum(tf.matmul(x, w) * tf.gather(emb, [1]))
        plain = v1.train.GradientDescentOptimizer(1.0).compute_gradients(loss)
        opt = tf_amp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(1.0), 2.0**12)
        scaled = opt.compute_gradients(loss)
        assert isinstance(scaled[1][0], tf.IndexedSlices)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            np.testing.assert_array_equal(*sess.run([plain[0][0], scaled[0][0]]))
            np.testing.assert_array_equal(*sess.run([plain[1][0].values, scaled[1][0].values]))


def test_the_inner_optimizer_is_called_by_keyword_as_tensorflows_minimize_calls_it():
    # An override that takes only (loss, var_list=None, **kwargs) works under TensorFlow's
    # minimize; the wrapper passed six positional arguments and it raised a TypeError.
    class KeywordsOnly(v1.train.GradientDescentOptimizer):
        def compute_gradients(self, loss, var_list=None, **kwargs):  # noqa: ANN001, ANN201
            return super().compute_gradients(loss, var_list, **kwargs)

        def apply_gradients(self, grads_and_vars, **kwargs):  # noqa: ANN001, ANN201
            return super().apply_gradients(grads_and_vars, **kwargs)

    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=tf.constant([3.0, 4.0]))
        step = v1.train.get_or_create_global_step()
        opt = tf_amp.LossScaleOptimizer(KeywordsOnly(0.5), 4.0)
        train = opt.minimize(tf.reduce_sum(w * w) / 2.0, global_step=step)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train)
            np.testing.assert_array_equal(sess.run(w), [1.5, 2.0])
            assert sess.run(step) == 1


def test_clipping_between_compute_and_apply_rechecks_the_clipped_gradients():
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=tf.constant([3.0, 4.0]))
        opt = tf_amp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(1.0), 2.0**20)
        ((g, v),) = opt.compute_gradients(tf.reduce_sum(w * w) / 2.0)
        clipped, _ = tf.clip_by_global_norm([g], 1.0)
        train = opt.apply_gradients([(clipped[0], v)])
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train)
            np.testing.assert_allclose(sess.run(w), [2.4, 3.2], rtol=1e-6)


def test_saver_round_trip_and_resume_follow_one_schedule(tmp_path):
    """5 steps + save + restore in a new graph + 5 steps == 10 steps straight."""
    schedule = [1.0, np.inf, 1.0, 1.0, 1.0, 1.0, np.nan, 1.0, 1.0, 1.0]
    policy = DynamicLossScale(16.0, growth_interval=2)

    def run(steps, restore_from=None, save_to=None):
        with tf.Graph().as_default():
            opt, train, poison, _ = build_graph(policy)
            saver = v1.train.Saver()
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                if restore_from:
                    saver.restore(sess, restore_from)
                for bad in steps:
                    sess.run(train, {poison: bad})
                if save_to:
                    saver.save(sess, save_to)
                return session_state(sess, opt)[1] + [
                    sess.run(v).tobytes() for v in opt._state_vars
                ], [sess.run(v) for v in opt._state_vars]

    straight, straight_state = run(schedule)
    path = os.path.join(tmp_path, "model")
    _, saved_state = run(schedule[:5], save_to=path)
    assert saved_state[0] == 16.0 and saved_state[2] == 1  # 16 -> 8 (inf) -> 16 (2 good)
    resumed, resumed_state = run(schedule[5:], restore_from=path)
    assert resumed == straight
    assert resumed_state[0] == straight_state[0] and resumed_state[2] == 2


@pytest.mark.parametrize("deferred", [False, True], ids=["built", "defer_build"])
@pytest.mark.parametrize("written_by", ["tensorflow_wrapper", "float32"])
def test_saver_restores_a_checkpoint_without_tf_amps_state(tmp_path, written_by, deferred):
    """A Saver checkpoint of TF1's own MixedPrecisionLossScaleOptimizer (its scale is
    `current_loss_scale`, its counter `good_steps`) or of float32 training restores into the
    wrapper; a plain Saver failed on the first missing `loss_scale_*` key (under the
    environment too when the Saver was built after `defer_build=True`)."""
    path = os.path.join(tmp_path, "model")
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=tf.constant([1.0, 2.0]))
        opt = v1.train.AdamOptimizer(0.01)
        if written_by == "tensorflow_wrapper":
            scale = v1.mixed_precision.DynamicLossScale(
                initial_loss_scale=2.0**10, increment_period=3)
            opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, scale)
        train = opt.minimize(tf.reduce_sum(w * 3.0),
                             global_step=v1.train.get_or_create_global_step())
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train)
            v1.train.Saver().save(sess, path)
            saved_w = sess.run(w)
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=tf.constant([0.0, 0.0]))
        wrapper = tf_amp.LossScaleOptimizer(v1.train.AdamOptimizer(0.01),
                                            DynamicLossScale(4.0, growth_interval=3))
        wrapper.minimize(tf.reduce_sum(w * 3.0), global_step=v1.train.get_or_create_global_step())
        init = v1.global_variables_initializer()
        saver = v1.train.Saver(defer_build=deferred)
        if deferred:  # built later, as the old Estimator did
            saver.build()
        tf.compat.v1.get_default_graph().finalize()  # as a MonitoredTrainingSession does
        with v1.Session() as sess:
            sess.run(init)
            saver.restore(sess, path)
            np.testing.assert_array_equal(sess.run(w), saved_w)
            scale, good_steps, skipped, _, _ = sess.run(wrapper._state_vars)
    if written_by == "tensorflow_wrapper":
        assert (scale, good_steps, skipped) == (2.0**10, 1, 0)
    else:
        assert (scale, good_steps, skipped) == (4.0, 0, 0)  # afresh


REFERENCE_GLOBAL_STEP = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow.compat.v1 as tf
    tf.disable_eager_execution()  # control flow v2 stays on
    import tf_amp
    step = tf.Variable(0, name="global_step", trainable=False, use_resource=False)
    w = tf.get_variable("w", [3, 1], initializer=tf.ones_initializer(), use_resource=True)
    poison = tf.placeholder_with_default(tf.constant(1.0), [])
    loss = tf.reduce_mean(tf.square(tf.matmul(tf.ones([4, 3]), w) - 1.0)) * poison
    opt = tf.train.AdamOptimizer(0.1)
    if sys.argv[1] == "explicit":
        opt = tf_amp.LossScaleOptimizer(opt, 4.0)
    train = opt.minimize(loss, global_step=step)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for bad in (1.0, np.inf, 1.0):
            sess.run(train, {poison: bad})
        wrapper = opt if sys.argv[1] == "explicit" else opt.__dict__["_tf_amp_auto_wrapper"]
        print("global_step", sess.run(step), "skipped", sess.run(wrapper._state_vars[2]))
    """
)


@pytest.mark.parametrize("way", ["explicit", "environment"])
def test_a_reference_global_step_next_to_resource_weights_builds_and_counts(way):
    """The skip cond was a v2 cond when only the trained variables were reference ones, and
    it captured a reference global step by value: "expected types ([tf.int32_ref, ...])". A
    legacy script (get_or_create_global_step after disable_resource_variables, Keras layers'
    resource weights) failed so under the environment."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2",
               TF_AMP_TARGET_DTYPE="float16")
    if way == "environment":
        env["TF_ENABLE_AUTO_MIXED_PRECISION"] = "1"
    done = subprocess.run([sys.executable, "-c", REFERENCE_GLOBAL_STEP, way], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    words = done.stdout.split()
    step, skipped = int(words[-3]), int(words[-1])
    # Every step counted but the skipped ones (the inf one, and under the environment's
    # initial scale of 2**15 maybe the first).
    assert skipped >= 1 and step + skipped == 3, done.stdout


def test_tf_function_minimize_and_checkpoint_round_trip(tmp_path):
    v = tf.Variable([1.0, 2.0])
    step = tf.Variable(0, dtype=tf.int64)
    opt = tf_amp.LossScaleOptimizer(v1.train.MomentumOptimizer(0.1, 0.9), DynamicLossScale(8.0))

    @tf.function
    def train(bad):
        opt.minimize(lambda: tf.reduce_sum(v * v) * bad, var_list=[v], global_step=step)

    train(tf.constant(1.0))
    momentum_before = opt.get_slot(v, "momentum").numpy().copy()
    weights_before = v.numpy().copy()
    train(tf.constant(np.inf))
    assert v.numpy().tobytes() == weights_before.tobytes()
    assert opt.get_slot(v, "momentum").numpy().tobytes() == momentum_before.tobytes()
    assert int(step) == 1 and float(opt.loss_scale) == 4.0 and int(opt.skipped_steps) == 1

    ckpt = tf.train.Checkpoint(optimizer=opt, v=v, step=step)
    path = ckpt.save(os.path.join(tmp_path, "ck"))
    train(tf.constant(np.nan))
    assert float(opt.loss_scale) == 2.0
    ckpt.restore(path).assert_existing_objects_matched()
    assert float(opt.loss_scale) == 4.0 and int(opt.skipped_steps) == 1


def test_enabled_false_and_errors():
    with tf.Graph().as_default():
        w = v1.get_variable("w", initializer=tf.constant([1.0]))
        opt = tf_amp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(1.0), enabled=False)
        train = opt.minimize(tf.reduce_sum(w * w) * np.float32(np.inf))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train)
            assert np.isnan(sess.run(w)[0]) or np.isinf(sess.run(w)[0])  # no skipping
    inner = v1.train.AdamOptimizer()
    wrapped = tf_amp.LossScaleOptimizer(inner)
    with pytest.raises(ValueError, match="already a tf_amp LossScaleOptimizer"):
        tf_amp.LossScaleOptimizer(wrapped)
    marked = tf_amp.enable_mixed_precision_graph_rewrite(v1.train.AdamOptimizer())
    tf_amp.disable_mixed_precision_graph_rewrite()
    assert isinstance(marked, V1LossScaleOptimizer) and marked._tf_amp_graph_rewrite


def test_tensorflows_own_tf1_loss_scale_wrapper_is_refused():
    # It was taken: the two scales multiplied (2**15 * 2**15), the float16 gradients
    # overflowed and every step was skipped, without a word.
    from tf_amp.enable import is_rewrite_enabled

    tf1_wrapper = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
        v1.train.GradientDescentOptimizer(0.1), "dynamic"
    )
    with pytest.raises(ValueError, match="MixedPrecisionLossScaleOptimizer, which scales"):
        tf_amp.LossScaleOptimizer(tf1_wrapper)
    with pytest.raises(ValueError, match="MixedPrecisionLossScaleOptimizer, which scales"):
        tf_amp.enable_mixed_precision_graph_rewrite(tf1_wrapper)
    assert not is_rewrite_enabled()


def test_tape_recipe_with_get_scaled_loss_and_get_unscaled_gradients():
    w = tf.Variable([2.0, -1.0])
    opt = tf_amp.LossScaleOptimizer(v1.train.GradientDescentOptimizer(0.5), 2.0**10)
    for bad in (1.0, np.inf):
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(tf.reduce_sum(w * w) * bad)
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, [w]))
        opt.apply_gradients(zip(grads, [w], strict=True))
    np.testing.assert_array_equal(w.numpy(), [0.0, 0.0])  # w - 0.5 * 2w, then a skipped step
    assert int(opt.skipped_steps) == 1


def test_session_floor_warning_and_raise_after_consecutive_skips(capfd):
    with tf.Graph().as_default():
        _, train, poison, _ = build_graph(
            DynamicLossScale(initial_scale=1.0), max_consecutive_skips=3
        )
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(train, {poison: np.nan})
            sess.run(train, {poison: np.nan})
            with pytest.raises(tf.errors.InvalidArgumentError, match="3 consecutive steps"):
                sess.run(train, {poison: np.nan})
    err = capfd.readouterr().err
    assert err.count("loss scale is at its floor") == 1, err


# ----------------------------------------------------------------- tf.train.Checkpoint layouts
def _adam_setup(kind: str):
    var = tf.Variable([1.0, -2.0])
    inner = v1.train.AdamOptimizer(0.1)
    if kind == "plain":
        opt = inner
    elif kind == "tf_amp":
        opt = tf_amp.LossScaleOptimizer(inner, DynamicLossScale(64.0, growth_interval=2))
    else:  # TensorFlow's own TF1 wrapper
        opt = v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            inner, v1.mixed_precision.DynamicLossScale(64.0, increment_period=2)
        )

    @tf.function
    def step():
        opt.minimize(lambda: tf.reduce_sum(var * var), var_list=[var])

    return var, opt, inner, step


def _adam_state(var, inner) -> tuple[list[float], float]:
    beta1_power, _ = inner._get_beta_accumulators()
    return inner.get_slot(var, "m").numpy().tolist(), float(beta1_power)


@pytest.mark.parametrize(("source", "target"), [("tf1", "tf_amp"), ("plain", "tf_amp"),
                                                ("tf_amp", "plain"), ("tf_amp", "tf_amp")])
@pytest.mark.parametrize("restore_first", [False, True])
def test_checkpoints_move_between_the_wrapper_and_the_optimizers_it_replaces(
    tmp_path, source: str, target: str, restore_first: bool
) -> None:
    # The wrapper wrote the inner optimizer under "inner_optimizer": a plain Adam's or TF1's
    # wrapper's checkpoint restored nothing of Adam (slots, beta powers) without an error,
    # and TF1's scale was lost. restore_first: restored before the first step made the slots.
    var, opt, inner, step = _adam_setup(source)
    for _ in range(3):
        step()
    path = tf.train.Checkpoint(opt=opt, var=var).save(str(tmp_path / "ckpt"))
    saved = _adam_state(var, inner)
    var2, opt2, inner2, step2 = _adam_setup(target)
    if not restore_first:
        step2()
    status = tf.train.Checkpoint(opt=opt2, var=var2).restore(path)
    if target == "plain":
        status.expect_partial()
    if not restore_first:
        assert _adam_state(var2, inner2) == saved
    else:  # the slots and beta powers take the restored values when the first step makes them
        np.testing.assert_array_equal(var2.numpy(), var.numpy())
        step2()
        step()
        np.testing.assert_allclose(var2.numpy(), var.numpy(), rtol=1e-6)
    if source == "tf1":  # 64, doubled after two good steps: 128 and one good step, saved
        assert float(opt2.loss_scale) == float(opt._loss_scale())
        assert int(opt2.dynamic_counter) == int(opt._loss_scale._num_good_steps)
        assert float(opt2.loss_scale) == (256.0 if restore_first else 128.0)
    if source == "tf_amp" and target == "tf_amp":
        status.assert_existing_objects_matched()
        assert float(opt2.loss_scale) == float(opt.loss_scale)


def test_a_checkpoint_of_the_earlier_layout_still_restores(tmp_path) -> None:
    # Earlier wrappers wrote the inner optimizer under "inner_optimizer" and the state as
    # loss_scale_<field>; written here with the same names.
    from tf_amp._upstream.tensorflow import AutoTrackable

    var, _, inner, step = _adam_setup("plain")
    for _ in range(2):
        step()
    old = AutoTrackable()
    old.inner_optimizer = inner
    old.loss_scale_scale = tf.Variable(32.0)
    old.loss_scale_good_steps = tf.Variable(1, dtype=tf.int64)
    path = tf.train.Checkpoint(opt=old, var=var).save(str(tmp_path / "old"))
    var2, opt2, inner2, step2 = _adam_setup("tf_amp")
    step2()
    tf.train.Checkpoint(opt=opt2, var=var2).restore(path).expect_partial()
    assert _adam_state(var2, inner2) == _adam_state(var, inner)
    assert float(opt2.loss_scale) == 32.0 and int(opt2.dynamic_counter) == 1
