"""``enable_mixed_precision_graph_rewrite(opt)`` alone connects Keras ``fit`` to the rewrite.

No fixture installs anything here: the wrapper returned by ``enable_...`` must be enough for
``compile`` + ``fit`` to run the float16 step, and ``disable_...`` must undo the hook it made.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tests.e2e_helpers import HEAVY_OPS, half_ops_of_functions
from tf_amp.enable import is_rewrite_enabled, optimizer_wants_rewrite
from tf_amp.runtime import keras_fit


def _compiled_model(optimizer: keras.optimizers.Optimizer) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    model.compile(optimizer=optimizer, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_enable_then_compile_and_fit_runs_float16_and_disable_undoes_the_hook():
    original_compile = keras.Model.compile
    x = np.random.default_rng(0).random((32, 8, 8, 1), dtype=np.float32)
    y = np.arange(32, dtype=np.int32) % 3
    try:
        opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
        model = _compiled_model(opt)
        assert keras_fit.is_installed(model)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        train = keras_fit.rewritten_functions(model)["train"]
        assert half_ops_of_functions(train.rewritten_concrete_functions()) & HEAVY_OPS
        assert int(opt.iterations) == 2
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
    assert keras.Model.compile is original_compile
    plain = _compiled_model(keras.optimizers.SGD(0.1))
    assert not keras_fit.is_installed(plain)


def test_enable_written_inside_the_first_compile_call_still_hooks_the_model():
    """``model.compile(optimizer=enable_...(opt))``: Python looks up ``model.compile`` before
    the argument installs the compile hook, so the model is hooked at its first fit."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    original_builder = TensorFlowTrainer.make_train_function
    x = np.random.default_rng(0).random((32, 8, 8, 1), dtype=np.float32)
    y = np.arange(32, dtype=np.int32) % 3
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    try:
        model.compile(optimizer=tf_amp.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(0.1)), jit_compile=False,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        assert keras_fit.is_installed(model)
        train = keras_fit.rewritten_functions(model)["train"]
        assert half_ops_of_functions(train.rewritten_concrete_functions()) & HEAVY_OPS
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
    assert TensorFlowTrainer.make_train_function is original_builder
    plain = _compiled_model(keras.optimizers.SGD(0.1))
    plain.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert not keras_fit.is_installed(plain)


def test_v1_optimizers_do_not_touch_keras():
    original_compile = keras.Model.compile
    try:
        opt = tf_amp.enable_mixed_precision_graph_rewrite(
            tf.compat.v1.train.GradientDescentOptimizer(0.1))
        assert keras.Model.compile is original_compile
        assert opt._tf_amp_graph_rewrite
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()


def test_recompiling_with_a_plain_optimizer_after_disable_returns_to_float32():
    """README: recompiling with a plain optimizer after ``disable_...`` returns the model to
    float32, although the restored ``compile`` knows nothing of the model's earlier hook."""
    x = np.random.default_rng(0).random((16, 8, 8, 1), dtype=np.float32)
    y = np.arange(16, dtype=np.int32) % 3
    try:
        opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
        model = _compiled_model(opt)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        assert keras_fit.rewritten_functions(model)
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
    model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert not keras_fit.is_installed(model)
    assert "make_train_function" not in vars(model)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert not keras_fit.rewritten_functions(model)  # Keras's own float32 step ran


def test_a_saved_rewrite_enabled_model_loads_still_wanting_the_rewrite(tmp_path):
    """Resuming from a .keras file keeps the rewrite and the restored loss scale, without
    wrapping again (which would refuse a wrapper, or start a fresh scale)."""
    x = np.random.default_rng(0).random((32, 8, 8, 1), dtype=np.float32)
    y = np.arange(32, dtype=np.int32) % 3
    path = str(tmp_path / "model.keras")
    try:
        opt = tf_amp.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(0.1), loss_scale=tf_amp.DynamicLossScale(256.0)
        )
        model = _compiled_model(opt)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        model.save(path)
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
    assert not is_rewrite_enabled()
    try:
        loaded = keras.models.load_model(path)
        assert optimizer_wants_rewrite(loaded.optimizer)
        assert is_rewrite_enabled()
        assert float(loaded.optimizer.loss_scale) == 256.0
        assert keras_fit.is_installed(loaded)
        loaded.fit(x, y, batch_size=16, epochs=1, verbose=0)
        train = keras_fit.rewritten_functions(loaded)["train"]
        assert half_ops_of_functions(train.rewritten_concrete_functions()) & HEAVY_OPS
        assert int(loaded.optimizer.iterations) == 4
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
    plain = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    assert plain.get_config()["graph_rewrite"] is False
    assert not optimizer_wants_rewrite(type(plain).from_config(plain.get_config()))


@pytest.mark.parametrize(
    ("saved_on", "loaded_on", "scaling", "rewrite"),
    [
        ("bfloat16", "float16", True, True),  # was: float16 trained with no loss scaling
        ("float32", "float16", True, True),  # was: never rewritten, and enable_ refused it
        ("float16", "float32", False, False),
    ],
)
def test_a_saved_enable_wrapper_settles_its_scaling_and_rewrite_where_it_loads(
    tmp_path, monkeypatch, saved_on, loaded_on, scaling, rewrite
):
    """``enable_``'s choices (loss scaling, rewrite) were saved as plain values and loaded as
    they were: a .keras file saved where the target was bfloat16 trained float16 unscaled
    where it is float16 (small gradients underflowed: 136 of 512 weights moved, 418 with
    scaling). A wrapper built with explicit settings keeps them."""
    from tf_amp import hardware

    def target(dtype: str) -> None:  # float32: what auto picks without fast reduced precision
        monkeypatch.setenv("TF_AMP_TARGET_DTYPE", "auto" if dtype == "float32" else dtype)
        monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2"}))

    path = str(tmp_path / "model.keras")
    target(saved_on)
    try:
        model = _compiled_model(tf_amp.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(0.1)))
        model.save(path)
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
    target(loaded_on)
    try:
        loaded = keras.models.load_model(path)
        assert loaded.optimizer.enabled is scaling
        assert optimizer_wants_rewrite(loaded.optimizer) is rewrite
        assert loaded.optimizer.get_config()["settled_by_target"]  # and so on, if saved again
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
    explicit = tf_amp.enable_mixed_precision_graph_rewrite(
        keras.optimizers.SGD(0.1), enabled=False)
    changed = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    changed.enabled = not changed.enabled  # set by hand after enable_: saved as it is
    tf_amp.disable_mixed_precision_graph_rewrite()
    assert not explicit.get_config()["settled_by_target"]
    assert not changed.get_config()["settled_by_target"]
    assert type(changed).from_config(changed.get_config()).enabled is changed.enabled


def test_a_model_whose_own_policy_computes_in_float16_gets_loss_scaling(monkeypatch):
    """Keras's ``compile`` scales the loss of a model whose dtype policy is mixed_float16, and
    does not once given a wrapper; ``enable_`` under a bfloat16 target returned one without
    scaling, so the float16 gradients went unscaled (136 of 512 weights moved, 418 scaled)."""
    monkeypatch.setenv("TF_AMP_TARGET_DTYPE", "bfloat16")
    x = np.random.default_rng(0).standard_normal((32, 8)).astype(np.float32)

    class Net(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.hidden = keras.layers.Dense(16, dtype=self.dtype_policy)
            self.out = keras.layers.Dense(1, dtype=self.dtype_policy)

        def call(self, inputs):
            return self.out(self.hidden(inputs))

    model = Net(dtype="mixed_float16")
    model(x[:1])
    try:
        opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
        assert not opt.enabled  # bfloat16: no scaling, as far as enable_ can tell
        model.compile(opt, loss="mse")
        model.fit(x, x[:, :1], batch_size=32, epochs=1, verbose=0)
        assert opt.enabled and float(opt.loss_scale) == 2.0**15
    finally:
        tf_amp.disable_mixed_precision_graph_rewrite()
