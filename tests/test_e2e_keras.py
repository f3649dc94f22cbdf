"""Keras 3 fit / evaluate / predict run the rewritten float16 step; user code unchanged.

The model is compiled with an optimizer from ``enable_mixed_precision_graph_rewrite``; the
compile hook (``keras_fit.install_compile_hook``, which the env activation installs too) then
replaces the instance's ``make_*_function``. Evaluate and predict are rewritten as well (a
documented decision), with outputs kept float32.
"""

from __future__ import annotations

from collections.abc import Iterator

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tests.e2e_helpers import HEAVY_OPS, half_ops_of_functions
from tf_amp.runtime import keras_fit

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def compile_hook() -> Iterator[None]:
    keras_fit.install_compile_hook()
    yield
    keras_fit.uninstall_compile_hook()


def _model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )


def _data(n: int = 96) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.random((n, 8, 8, 1), dtype=np.float32)
    y = x.reshape(n, -1)[:, :10].argmax(axis=1).astype(np.int32)
    return x, y


def _compile(model: keras.Model, optimizer: keras.optimizers.Optimizer, **kwargs) -> None:
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **kwargs,
    )


def test_fit_runs_the_half_step_with_steps_per_execution(compile_hook: None) -> None:
    model = _model()
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(1e-2))
    _compile(model, opt, steps_per_execution=4, jit_compile=False)
    assert keras_fit.is_installed(model)
    x, y = _data()
    moving_mean = model.layers[1].moving_mean.numpy().copy()

    history = model.fit(x, y, batch_size=16, epochs=4, verbose=0)

    steps = keras_fit.rewritten_functions(model)["train"]
    assert half_ops_of_functions(steps.rewritten_concrete_functions()) >= HEAVY_OPS
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0]
    assert int(opt.iterations) == 4 * 6  # every batch ran once, 4 per call
    assert not np.allclose(moving_mean, model.layers[1].moving_mean.numpy())  # BN stats
    assert float(opt.loss_scale) >= 1.0 and int(opt.skipped_steps) >= 0


@pytest.mark.parametrize("unrolled", [1, 2])
@pytest.mark.parametrize("batches", [7, 6])
def test_a_dataset_of_unknown_length_counts_each_batch_once(
    compile_hook: None, batches: int, unrolled: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The multi-step loop ran its first step on get_next() outside any cond: in the call that
    met the end of the data, the optimizer's iterations (which read no data) still moved, one
    extra step per epoch. (bfloat16: no loss scale's cond around the update.) With Keras's
    ``unrolled_steps_per_execution``, two steps run per iteration of the loop; a step past
    ``steps_per_execution`` or the data's end runs nothing."""
    monkeypatch.setenv("TF_AMP_TARGET_DTYPE", "bfloat16")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.05))
    model.compile(optimizer=opt, loss="mse", steps_per_execution=3)
    model.unrolled_steps_per_execution = unrolled
    x = np.random.default_rng(0).normal(size=(batches * 10, 4)).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1] * 2)).filter(lambda a, b: True)
    history = model.fit(data.batch(10), epochs=2, verbose=0)
    assert int(model.optimizer.iterations) == 2 * batches
    # The loop's body holds two conds per step it runs (run the step or not, fetch the next
    # batch or not), one pair per unrolled step.
    cells = [cell.cell_contents for cell in model.train_function.__closure__]
    (loop_function,) = (c for c in cells if hasattr(c, "_list_all_concrete_functions"))
    (traced,) = loop_function._list_all_concrete_functions()
    (body,) = (f for f in traced.graph.as_graph_def().library.function
               if f.signature.name.startswith("while_body"))
    assert sum(n.op in ("If", "StatelessIf") for n in body.node_def) == 2 * unrolled
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_a_model_run_eagerly_takes_data_with_a_missing_entry(compile_hook: None) -> None:
    """Keras hands a missing sample weight as an empty Optional; the eager step got it as is
    and failed to convert it to a tensor (graph steps were converted)."""
    x, y = np.ones((6, 4), np.float32), np.ones((6, 1), np.float32)

    def batches():
        for i in range(0, 6, 3):
            yield x[i:i + 3], y[i:i + 3], None

    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    plain.compile(keras.optimizers.SGD(0.01), loss="mse", run_eagerly=True)
    try:
        plain.fit(batches(), verbose=0)
    except AttributeError as error:  # Keras 3.7's eager step itself takes no None entry
        pytest.skip(f"Keras {keras.__version__} fails the same without tf_amp: {error}")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.01)),
                  loss="mse", run_eagerly=True)
    assert np.isfinite(model.fit(batches(), verbose=0).history["loss"][0])
    assert np.isfinite(model.evaluate(batches(), verbose=0))


def test_evaluate_and_predict_are_rewritten_and_keep_float32_outputs(compile_hook: None) -> None:
    model = _model()
    _compile(model, tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1)))
    x, y = _data()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    loss, accuracy = model.evaluate(x, y, batch_size=32, verbose=0)
    predictions = model.predict(x, batch_size=32, verbose=0)

    functions = keras_fit.rewritten_functions(model)
    for kind in ("test", "predict"):
        rewritten = functions[kind].rewritten_concrete_functions()
        assert {"Conv2D", "MatMul"} <= half_ops_of_functions(rewritten), kind
        # each kind's graph named apart in the log lines and files (all were Keras's name)
        assert all(f"one_{kind}_step_on_data" in f.graph.name for f in rewritten), kind
    assert predictions.dtype == np.float32 and predictions.shape == (96, 10)
    reference = model(x, training=False).numpy()  # float32 eager forward, same weights
    error = np.abs(predictions - reference).max() / np.abs(reference).max()
    assert 1e-6 < error < 1e-2  # float16 rounding: present, and small
    assert np.isfinite(loss) and 0.0 <= accuracy <= 1.0


def test_jit_compile_is_honoured() -> None:
    model = _model()
    _compile(model, keras.optimizers.SGD(0.1), jit_compile=True)
    keras_fit.install(model)
    x, y = _data()
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    (concrete,) = keras_fit.rewritten_functions(model)["train"].rewritten_concrete_functions()
    assert concrete.function_def.attr["_XlaMustCompile"].b
    assert "Conv2D" in half_ops_of_functions([concrete])
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_plain_optimizer_leaves_the_model_alone(compile_hook: None) -> None:
    mixed, plain = _model(), _model()
    _compile(mixed, tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1)))
    _compile(plain, keras.optimizers.SGD(0.1))
    assert keras_fit.is_installed(mixed) and not keras_fit.is_installed(plain)
    # Recompiling with a plain optimizer returns the model to Keras's own float32 step.
    _compile(mixed, keras.optimizers.SGD(0.1))
    assert not keras_fit.is_installed(mixed)
    assert "make_train_function" not in vars(mixed)
    x, y = _data()
    plain.fit(x, y, epochs=1, verbose=0)
    assert keras_fit.rewritten_functions(plain) == {}


def test_compile_hook_is_reversible() -> None:
    original = keras.Model.compile
    keras_fit.install_compile_hook()
    assert keras.Model.compile is not original
    keras_fit.uninstall_compile_hook()
    assert keras.Model.compile is original


def test_weights_trained_in_mixed_precision_load_into_float32_and_back(
    compile_hook: None, tmp_path
) -> None:
    x, y = _data()
    mixed = _model(0)
    _compile(mixed, tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(1e-2)))
    mixed.fit(x, y, batch_size=32, epochs=2, verbose=0)
    mixed.save_weights(tmp_path / "mixed.weights.h5")

    fp32 = _model(1)
    _compile(fp32, keras.optimizers.Adam(1e-2))
    fp32.load_weights(tmp_path / "mixed.weights.h5")
    # The same call on both (one batch of all rows): predict's batches of 32 would go through
    # another GEMM blocking, which on an AVX2 CPU rounds some outputs 3e-7 apart.
    np.testing.assert_array_equal(fp32(x, training=False).numpy(), mixed(x, training=False).numpy())
    assert all(np.array_equal(a, b) for a, b in zip(fp32.get_weights(), mixed.get_weights(),
                                                    strict=True))
    assert all(w.dtype == "float32" for w in fp32.weights)

    fp32.fit(x, y, batch_size=32, epochs=1, verbose=0)
    fp32.save_weights(tmp_path / "fp32.weights.h5")
    mixed.load_weights(tmp_path / "fp32.weights.h5")
    np.testing.assert_array_equal(mixed(x, training=False).numpy(), fp32(x, training=False).numpy())
    before = mixed.layers[-1].kernel.numpy().copy()
    mixed.fit(x, y, batch_size=32, epochs=1, verbose=0)  # keeps training in mixed precision
    assert not np.allclose(before, mixed.layers[-1].kernel.numpy())
    assert tf.reduce_all(tf.math.is_finite(mixed.layers[-1].kernel))


def test_jit_compile_with_loss_scaling_never_fails_to_compile() -> None:
    """The fused op has no XLA kernel: such a step runs without XLA (with a warning)."""
    model = _model()
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    _compile(model, opt, jit_compile=True)
    keras_fit.install(model)
    x, y = _data()
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    (concrete,) = keras_fit.rewritten_functions(model)["train"].rewritten_concrete_functions()
    graph_def = concrete.graph.as_graph_def()
    ops = {n.op for n in graph_def.node} | {
        n.op for f in graph_def.library.function for n in f.node_def
    }
    compiled = concrete.function_def.attr["_XlaMustCompile"].b
    assert compiled == ("TfAmpUnscaleAndCheckFinite" not in ops)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert int(opt.iterations) == 9


MIRRORED_SCRIPT = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, tf_amp
from tf_amp.runtime import keras_fit
from tests.e2e_helpers import half_ops_of_functions
keras.utils.set_random_seed(0)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(1e-2))
    model.compile(opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
keras_fit.install(model)
x = np.random.default_rng(0).random((128, 8, 8, 1), dtype=np.float32)
y = x.reshape(128, -1)[:, :10].argmax(1)
losses = model.fit(x, y, batch_size=32, epochs=4, verbose=0).history["loss"]
step = keras_fit.rewritten_functions(model)["train"]
print("RESULT", losses[0], losses[-1], int(opt.iterations.numpy()),
      sorted(half_ops_of_functions(step.rewritten_concrete_functions()) & {"Conv2D", "MatMul"}))
"""


def test_fit_under_mirrored_strategy_runs_the_half_step(tmp_path) -> None:
    """Two CPU replicas: by-reference (call-time) captures of the step are rebuilt too."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(repo), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fields = proc.stdout.split("RESULT")[1].split(maxsplit=3)
    first, last, iterations = float(fields[0]), float(fields[1]), int(fields[2])
    assert last < first
    assert iterations == 16
    assert "Conv2D" in fields[3] and "MatMul" in fields[3]


def test_attention_over_padding_trains_in_float16(compile_hook: None) -> None:
    # Keras masks attention logits with -1e9 in a float32 graph; folded to float16 it was
    # -inf, a fully masked (padded) query row's softmax was NaN, and every step was skipped.
    keras.utils.set_random_seed(0)
    tokens = keras.Input((6,), dtype="int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(tokens)
    attended = keras.layers.MultiHeadAttention(num_heads=1, key_dim=8)(embedded, embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(attended)
    model = keras.Model(tokens, keras.layers.Dense(1, activation="sigmoid")(pooled))
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(1e-2))
    model.compile(optimizer=opt, loss="binary_crossentropy")
    x = np.array([[5, 3, 7, 0, 0, 0], [2, 4, 0, 0, 0, 0]] * 4)
    y = np.array([0.0, 1.0] * 4, np.float32)
    losses = model.fit(x, y, batch_size=8, epochs=4, verbose=0).history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
    assert int(opt.skipped_steps) == 0
    assert np.isfinite(model.predict(x, verbose=0)).all()


@pytest.mark.parametrize("target", ["float16", "bfloat16"])
def test_a_loss_on_probabilities_trains_like_float32(
    compile_hook: None, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # binary_crossentropy clips probabilities to [1e-7, 1 - 1e-7]; painted half (TensorFlow's
    # passes 3 and 4 paint a loss between the forward's and the backward's MatMuls), 1 - 1e-7
    # was 1.0 and log(1 - p) log(0): NaN from the third epoch, NaN weights in bfloat16.
    monkeypatch.setenv("TF_AMP_TARGET_DTYPE", target)
    rng = np.random.RandomState(0)
    x = rng.randn(256, 4).astype("float32")
    y = (x[:, :1] > 0).astype("float32")

    def train(optimizer: keras.optimizers.Optimizer) -> tuple[list[float], keras.Model]:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        probabilities = keras.layers.Dense(1, activation="sigmoid")(hidden)
        # A layer after the sigmoid: Keras cannot take the logits back, the clip is used.
        model = keras.Model(inputs, keras.layers.Reshape((1,))(probabilities))
        model.compile(optimizer=optimizer, loss="binary_crossentropy")
        history = model.fit(x, y, batch_size=32, epochs=6, verbose=0).history["loss"]
        return history, model

    float32_losses, _ = train(keras.optimizers.Adam(5e-2))
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.Adam(5e-2))
    amp_losses, model = train(opt)
    assert np.isfinite(amp_losses).all(), amp_losses
    assert all(np.isfinite(w).all() for w in model.get_weights())
    np.testing.assert_allclose(amp_losses[-1], float32_losses[-1], atol=0.01)


def test_fit_runs_eagerly_under_run_functions_eagerly(compile_hook: None) -> None:
    """``tf.config.run_functions_eagerly(True)`` runs Keras's steps eagerly (breakpoints and
    prints in ``call`` work); the rewritten steps were traced and run as graphs regardless."""
    seen: list[bool] = []

    class Watch(keras.layers.Layer):
        def call(self, x):
            seen.append(tf.executing_eagerly())
            return x

    model = keras.Sequential([keras.Input((3,)), Watch(), keras.layers.Dense(1)])
    model.compile(tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1)),
                  loss="mse")
    x, y = np.ones((4, 3), np.float32), np.ones((4, 1), np.float32)
    tf.config.run_functions_eagerly(True)
    try:
        seen.clear()
        model.fit(x, y, epochs=2, verbose=0)
        model.predict(x, verbose=0)
    finally:
        tf.config.run_functions_eagerly(False)
    assert seen and all(seen), seen
