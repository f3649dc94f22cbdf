"""What users moving from Keras 3's, tf.keras 2.x's or TF1's loss-scale optimizer rely on.

Each test is one scenario of issue 16: a bug those users hit, a config or file written by the
other wrappers, an attribute or a misuse they expect to behave as it did there. The ports of
the upstream test suites' own scenarios are in ``tests/test_upstream_loss_scale_ports.py``.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tf_amp.loss_scale import DynamicLossScale, StaticLossScale


def sgd_step(opt, var: tf.Variable, true_grad: float = 1.0) -> None:
    """One Keras-3-style step on ``loss = true_grad * var`` (its gradient is ``true_grad``)."""
    with tf.GradientTape() as tape:
        loss = opt.scale_loss(tf.reduce_sum(var * true_grad))
    opt.apply(tape.gradient(loss, [var]), [var])


# ------------------------------------------------------------------------------ the bugs
def test_counters_are_readable_before_the_first_step():
    static = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False, initial_scale=2.0)
    assert static.dynamic_counter is None  # a static scale has no counter (Keras, tf.keras)
    assert float(static.loss_scale) == 2.0 and int(static.skipped_steps) == 0
    dynamic = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0)
    assert int(dynamic.dynamic_counter) == 0 and int(dynamic.skipped_steps) == 0
    dynamic.loss_scale = 16.0  # settable before build too
    assert float(dynamic.scale_loss(tf.constant(1.0))) == 16.0


def test_checkpoint_restored_into_an_unbuilt_wrapper_is_the_scale_of_its_first_step(tmp_path):
    """Scale fell 8 -> 4 and was saved; a fresh wrapper restores it before it is built. The
    first step must scale and unscale with 4: true gradient 1, lr 1, from 0 ends at -1."""
    var = tf.Variable([0.0])
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8.0)
    sgd_step(opt, var, np.inf)  # skipped: 8 -> 4
    assert float(opt.loss_scale) == 4.0 and float(var[0]) == 0.0
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ckpt"))

    fresh_var = tf.Variable([0.0])
    fresh = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8.0)
    tf.train.Checkpoint(optimizer=fresh).restore(path)
    assert float(fresh.loss_scale) == 4.0  # restored at once, not at build
    assert float(fresh.scale_loss(tf.constant(1.0))) == 4.0
    sgd_step(fresh, fresh_var)
    assert float(fresh_var[0]) == -1.0
    assert int(fresh.skipped_steps) == 1


# ------------------------------------------------------------------- checkpoints both ways
def adam_trained(opt, var: tf.Variable, steps: int = 3):
    for _ in range(steps):
        sgd_step(opt, var, 0.5)
    return opt


def test_wrapper_checkpoint_restores_into_the_plain_optimizer(tmp_path):
    var = tf.Variable([1.0, 2.0])
    wrapper = adam_trained(tf_amp.LossScaleOptimizer(keras.optimizers.Adam(0.1)), var)
    path = tf.train.Checkpoint(optimizer=wrapper, var=var).save(str(tmp_path / "c"))

    plain_var = tf.Variable([0.0, 0.0])
    plain = keras.optimizers.Adam(0.1)
    status = tf.train.Checkpoint(optimizer=plain, var=plain_var).restore(path)
    plain.build([plain_var])
    status.assert_existing_objects_matched()  # every plain variable found its value
    assert int(plain.iterations) == 3
    for got, want in zip(plain.variables, wrapper.inner_optimizer.variables, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(AssertionError, match="loss_scale"):
        status.assert_consumed()  # only the loss-scale state is left over
    status.expect_partial()


def test_wrapper_checkpoint_goes_back_to_keras3s_wrapper_through_its_inner_optimizer(tmp_path):
    """Keras 3's own LossScaleOptimizer keeps different variables under the same checkpoint
    keys as the plain optimizer (so as ours): restored whole it fails on a dtype. Its inner
    optimizer takes ours as a plain checkpoint (the README's way back)."""
    var = tf.Variable([1.0, 2.0])
    wrapper = adam_trained(tf_amp.LossScaleOptimizer(keras.optimizers.Adam(0.1)), var)
    path = tf.train.Checkpoint(optimizer=wrapper, var=var).save(str(tmp_path / "c"))

    keras_var = tf.Variable([0.0, 0.0])
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.1))
    theirs.build([keras_var])
    with pytest.raises(tf.errors.InvalidArgumentError, match="dtype"):
        tf.train.Checkpoint(optimizer=theirs, var=keras_var).restore(path)
    status = tf.train.Checkpoint(optimizer=theirs.inner_optimizer, var=keras_var).restore(path)
    status.assert_existing_objects_matched()
    status.expect_partial()  # the scale, which Keras's wrapper starts afresh
    np.testing.assert_array_equal(keras_var.numpy(), var.numpy())
    assert int(theirs.inner_optimizer.iterations) == 3
    for got, want in zip(theirs.inner_optimizer.variables, wrapper.inner_optimizer.variables,
                         strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_plain_checkpoint_restores_into_a_wrapper_whose_scale_starts_afresh(tmp_path):
    var = tf.Variable([1.0, 2.0])
    plain = keras.optimizers.Adam(0.1)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * 0.5)
        plain.apply(tape.gradient(loss, [var]), [var])
    path = tf.train.Checkpoint(optimizer=plain, var=var).save(str(tmp_path / "c"))

    new_var = tf.Variable([0.0, 0.0])
    wrapper = tf_amp.LossScaleOptimizer(keras.optimizers.Adam(0.1), initial_scale=64.0)
    tf.train.Checkpoint(optimizer=wrapper, var=new_var).restore(path).assert_nontrivial_match()
    wrapper.build([new_var])
    assert int(wrapper.iterations) == 3 and float(wrapper.loss_scale) == 64.0
    for got, want in zip(wrapper.inner_optimizer.variables, plain.variables, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    sgd_step(wrapper, new_var, 0.5)  # and training goes on from the restored moments
    sgd_step(plain, var, 0.5)
    np.testing.assert_allclose(new_var.numpy(), var.numpy(), rtol=1e-6)


# ------------------------------------------------------------------------------- configs
TF_KERAS_SGD = {  # the inner optimizer as tf.keras 2.x serialized it
    "class_name": "SGD",
    "config": {"name": "SGD", "learning_rate": 2.0, "decay": 0.0, "momentum": 0.5,
               "nesterov": False, "jit_compile": True, "is_legacy_optimizer": False},
}


def check_usable(opt, expected_var: float) -> None:
    var = tf.Variable([5.0])
    sgd_step(opt, var)  # true gradient 1, lr 2, momentum starts at 0
    assert float(var[0]) == expected_var


def test_from_config_of_keras3_loss_scale_optimizer():
    keras_lso = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(2.0, momentum=0.5), initial_scale=4.0, dynamic_growth_steps=3
    )
    opt = tf_amp.LossScaleOptimizer.from_config(keras_lso.get_config())
    assert opt.loss_scale_policy == DynamicLossScale(4.0, growth_interval=3)
    assert opt.inner_optimizer.momentum == 0.5 and float(opt.learning_rate) == 2.0
    check_usable(opt, 3.0)
    assert int(opt.dynamic_counter) == 1


@pytest.mark.parametrize("initial", [2.0**30, 0.25])
def test_keras_scales_outside_the_default_bounds_load_unchanged(initial):
    """Keras's dynamic scale has no bounds; tf_amp's default ones, [1, 2**24], raised on such
    a config. The bound now widens to the scale, which keeps its value: a large one still
    halves on a skip, a small one is its own floor (tf_amp's never shrinks below what was
    asked, as below 1 a skip only shrinks gradients further)."""
    keras_lso = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(2.0, momentum=0.5), initial_scale=initial, dynamic_growth_steps=1
    )
    for opt in (
        tf_amp.LossScaleOptimizer.from_config(keras_lso.get_config()),
        tf_amp.LossScaleOptimizer(keras.optimizers.SGD(2.0, momentum=0.5),
                                  initial_scale=initial, dynamic_growth_steps=1),
    ):
        policy = opt.loss_scale_policy
        assert policy.initial_scale == initial and float(opt.loss_scale) == initial
        assert policy.get_config()["min_scale"] <= initial <= policy.get_config()["max_scale"]
        check_usable(opt, 3.0)
        sgd_step(opt, tf.Variable([5.0]), true_grad=float("inf"))  # skipped
        assert float(opt.loss_scale) == (initial / 2 if initial > 1 else initial)


@pytest.mark.parametrize("dynamic", [True, False])
def test_from_config_of_tf_keras_2_loss_scale_optimizer(dynamic):
    config = {"inner_optimizer": TF_KERAS_SGD, "dynamic": dynamic, "initial_scale": 2.0,
              "dynamic_growth_steps": 3 if dynamic else None}
    opt = tf_amp.LossScaleOptimizer.from_config(config)
    want = DynamicLossScale(2.0, growth_interval=3) if dynamic else StaticLossScale(2.0)
    assert opt.loss_scale_policy == want and opt.dynamic is dynamic
    assert opt.inner_optimizer.momentum == 0.5
    check_usable(opt, 3.0)


@pytest.mark.parametrize(
    "loss_scale, want",
    [
        ({"class_name": "FixedLossScale", "config": {"loss_scale_value": 2.0}},
         StaticLossScale(2.0)),
        ({"class_name": "DynamicLossScale",
          "config": {"initial_loss_scale": 2.0, "increment_period": 3, "multiplier": 4.0}},
         DynamicLossScale(2.0, growth_interval=3, growth_factor=4.0, backoff_factor=0.25)),
    ],
)
def test_from_config_of_tf_2_3_loss_scale_optimizer(loss_scale, want):
    """TF 2.3 wrote ``optimizer`` and a LossScale object; tf.keras refused multiplier != 2,
    tf_amp's DynamicLossScale has a growth and a backoff factor and takes any."""
    opt = tf_amp.LossScaleOptimizer.from_config({"optimizer": TF_KERAS_SGD,
                                                 "loss_scale": loss_scale})
    assert opt.loss_scale_policy == want
    check_usable(opt, 3.0)


def test_get_config_has_the_keras_and_tf_keras_keys_and_round_trips():
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0,
                                    dynamic_growth_steps=7)
    config = opt.get_config()
    assert (config["dynamic"], config["initial_scale"], config["dynamic_growth_steps"]) == (
        True, 8.0, 7)
    again = tf_amp.LossScaleOptimizer.from_config(config)
    assert again.loss_scale_policy == opt.loss_scale_policy
    static = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False, initial_scale=3)
    assert static.get_config()["dynamic_growth_steps"] is None
    assert keras.optimizers.deserialize(keras.optimizers.serialize(static)).get_config() == (
        static.get_config() | {"name": static.name})


def test_a_config_without_the_inner_optimizer_says_what_is_missing():
    with pytest.raises(ValueError, match="'inner_optimizer'.*'optimizer'"):
        tf_amp.LossScaleOptimizer.from_config({"initial_scale": 2.0})
    decayed = dict(TF_KERAS_SGD, config=dict(TF_KERAS_SGD["config"], decay=0.1))
    with pytest.raises(ValueError, match="InverseTimeDecay"):
        tf_amp.LossScaleOptimizer.from_config({"inner_optimizer": decayed})


# ------------------------------------------------------------------ attribute forwarding
@pytest.mark.parametrize("name, value", [("clipnorm", 1.5), ("global_clipnorm", 1.5),
                                         ("clipvalue", 1.5), ("ema_momentum", 0.8)])
def test_inner_attributes_read_and_set_through_the_wrapper(name, value):
    inner = keras.optimizers.SGD(1.0, **{name: value})
    opt = tf_amp.LossScaleOptimizer(inner)
    assert getattr(opt, name) == value
    setattr(opt, name, value * 2)
    assert getattr(inner, name) == value * 2


def test_clipping_set_on_the_wrapper_clips_the_unscaled_gradient():
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0)
    opt.clipvalue = 0.5
    var = tf.Variable([0.0])
    sgd_step(opt, var, 3.0)  # true gradient 3, clipped to 0.5 (not the scaled 12)
    assert float(var[0]) == -0.5


def test_use_ema_set_on_the_wrapper_averages_the_weights():
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    opt.use_ema, opt.ema_momentum = True, 0.5
    assert opt.inner_optimizer.use_ema and opt.inner_optimizer.ema_momentum == 0.5
    var = tf.Variable([0.0])
    sgd_step(opt, var)
    average = opt.inner_optimizer._model_variables_moving_average[0]  # noqa: SLF001
    assert float(var[0]) == -1.0 and float(average[0]) == -1.0  # first step copies
    sgd_step(opt, var)
    assert float(average[0]) == -1.5  # 0.5 * -1 + 0.5 * -2
    assert not hasattr(opt, "_model_variables_moving_average")  # one average: the inner's


def test_learning_rate_is_the_inner_one():
    inner = keras.optimizers.Adam(1.0)
    opt = tf_amp.LossScaleOptimizer(inner)
    opt.learning_rate = 0.005
    assert float(inner.learning_rate) == pytest.approx(0.005)
    assert opt.learning_rate is inner.learning_rate


# -------------------------------------------------------------------------------- misuse
def test_wrapping_an_optimizer_another_wrapper_already_wraps_is_refused():
    inner = keras.optimizers.SGD()
    first = tf_amp.LossScaleOptimizer(inner)
    with pytest.raises(ValueError, match="already wrapped by.*Use the existing wrapper"):
        tf_amp.LossScaleOptimizer(inner)
    v1_inner = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    v1_first = tf_amp.LossScaleOptimizer(v1_inner)
    with pytest.raises(ValueError, match="already wrapped by"):
        tf_amp.LossScaleOptimizer(v1_inner)
    del first, v1_first
    assert isinstance(tf_amp.LossScaleOptimizer(inner), tf_amp.LossScaleOptimizer)


@pytest.mark.parametrize("dynamic", ["dynamic", 1, None])
def test_dynamic_that_is_not_a_bool_says_what_to_pass(dynamic):
    with pytest.raises(TypeError, match="dynamic must be True or False"):
        tf_amp.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=dynamic)


def test_apply_of_gradients_never_scaled_nor_unscaled_warns_and_says_the_fix():
    opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=2.0)
    var = tf.Variable([0.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(var)  # forgot scale_loss
    with pytest.warns(UserWarning, match="not scaled with scale_loss.*opt.scale_loss"):
        opt.apply_gradients(zip(tape.gradient(loss, [var]), [var], strict=True))
    assert float(var[0]) == -0.5  # divided by the scale, as Keras 3's wrapper does
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # both recipes stay silent, eager and traced
        sgd_step(opt, var)
        tf.function(lambda: sgd_step(opt, var))()
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(tf.reduce_sum(var))
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
        opt.apply_gradients(zip(grads, [var], strict=True))
    with pytest.warns(UserWarning, match="not scaled"):  # a scale_loss serves one step only
        opt.apply([tf.constant([2.0])], [var])


def test_every_wrapper_is_an_instance_of_tf_amp_loss_scale_optimizer():
    keras_wrapper = tf_amp.LossScaleOptimizer(keras.optimizers.SGD())
    v1_wrapper = tf_amp.LossScaleOptimizer(tf.compat.v1.train.AdamOptimizer())
    rewrite_wrapper = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam())
    for wrapper in (keras_wrapper, v1_wrapper, rewrite_wrapper):
        assert isinstance(wrapper, tf_amp.LossScaleOptimizer)
    assert not isinstance(keras.optimizers.SGD(), tf_amp.LossScaleOptimizer)
    assert issubclass(type(keras_wrapper), tf_amp.LossScaleOptimizer)


# ------------------------------------------- files saved under TF_ENABLE_AUTO_MIXED_PRECISION
def env_on():
    from tf_amp.runtime import activation
    from tf_amp.runtime.activation import Settings

    return activation.activated(Settings(graph_rewrite=False, loss_scaling=True))


def fitted_model() -> keras.Model:
    rng = np.random.default_rng(0)
    x = rng.random((32, 8), dtype=np.float32)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), keras.losses.MeanSquaredError())
    model.fit(x, x.sum(axis=1, keepdims=True), batch_size=16, epochs=1, verbose=0)
    return model


def inner_state(optimizer) -> list[np.ndarray]:
    return [v.numpy() for v in getattr(optimizer, "inner_optimizer", optimizer).variables]


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_files_saved_under_the_env_and_in_float32_load_either_way(tmp_path, suffix):
    with env_on():
        amp = fitted_model()
        assert isinstance(amp.optimizer, tf_amp.LossScaleOptimizer)
        amp.save(tmp_path / f"amp{suffix}")
    plain = keras.models.load_model(tmp_path / f"amp{suffix}")  # plain Keras, no env
    assert type(plain.optimizer) is keras.optimizers.Adam
    assert int(plain.optimizer.iterations) == 2
    restored = inner_state(plain.optimizer)
    # Keras's own .h5 loader sets only the variables an unbuilt optimizer has (iterations,
    # learning rate), for a float32 file too; .keras files restore the moments as well.
    assert len(restored) == (6 if suffix == ".keras" else 2)
    for got, want in zip(restored, inner_state(amp.optimizer)[: len(restored)], strict=True):
        np.testing.assert_array_equal(got, want)

    f32 = fitted_model()
    f32.save(tmp_path / f"f32{suffix}")
    with env_on():
        resumed = keras.models.load_model(tmp_path / f"f32{suffix}")
        assert isinstance(resumed.optimizer, tf_amp.LossScaleOptimizer)
        assert int(resumed.optimizer.iterations) == 2
        restored = inner_state(resumed.optimizer)
        assert len(restored) == (6 if suffix == ".keras" else 2)  # as plain Keras loads it
        for got, want in zip(restored, inner_state(f32.optimizer)[: len(restored)], strict=True):
            np.testing.assert_array_equal(got, want)


def test_saved_models_written_under_the_env_and_in_float32_load_either_way(tmp_path):
    """tf.saved_model.save of a compiled model: loads without tf_amp, and its optimizer
    variables restore into a plain optimizer; a float32 one restores into the env's wrapper."""
    with env_on():
        amp = fitted_model()
        tf.saved_model.save(amp, str(tmp_path / "amp"))
    loaded = tf.saved_model.load(str(tmp_path / "amp"))
    assert int(loaded.optimizer._iterations) == 2  # noqa: SLF001
    plain = keras.optimizers.Adam(0.01)
    status = tf.train.Checkpoint(optimizer=plain).restore(str(tmp_path / "amp/variables/variables"))
    plain.build(amp.trainable_variables)
    status.expect_partial()
    for got, want in zip(inner_state(plain), inner_state(amp.optimizer), strict=True):
        np.testing.assert_array_equal(got, want)

    f32 = fitted_model()
    tf.saved_model.save(f32, str(tmp_path / "f32"))
    with env_on():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.01), keras.losses.MeanSquaredError())
        wrapper = model.optimizer
        status = tf.train.Checkpoint(optimizer=wrapper).restore(
            str(tmp_path / "f32/variables/variables")
        )
        wrapper.build(model.trainable_variables)
        status.expect_partial()
        assert isinstance(wrapper, tf_amp.LossScaleOptimizer)
        for got, want in zip(inner_state(wrapper), inner_state(f32.optimizer), strict=True):
            np.testing.assert_array_equal(got, want)


def test_floor_warning_skips_0_turns_the_floor_warning_off(capfd):
    """Documented as "0 disables the warning", and refused as a count below 1."""
    for skips, warned in ((0, False), (1, True)):
        opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1.0,
                                        floor_warning_skips=skips)
        capfd.readouterr()
        for _ in range(3):
            sgd_step(opt, tf.Variable([5.0]), true_grad=float("inf"))
        assert int(opt.skipped_steps) == 3
        assert ("floor" in capfd.readouterr().err) is warned
