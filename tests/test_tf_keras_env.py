"""tf_keras in subprocesses: unmodified Keras 2 scripts under the environment variable, and the
wrappers under a MirroredStrategy on two logical CPUs.

The scripts are the three in examples/ (``fit``, a custom ``train_step``, a ``tf.GradientTape``
loop), run with ``TF_USE_LEGACY_KERAS=1`` as a Keras 2 code base runs them, with tf_amp's
startup hook processed as at interpreter start (as tests/test_activation.py does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip(
    "tf_keras", reason="tf_keras is not installed (pip install --no-deps 'tf-keras==2.21.*')"
)

from tests.test_activation import ALL_VARS, PTH, _half_ops_in_logs  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

# After the script: the custom-loop loss-scale state, if the environment's tape patch made it.
BOOTSTRAP = textwrap.dedent(
    """
    import runpy, site, sys
    site.addsitedir(sys.argv[1]); sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    auto = sys.modules.get("tf_amp.runtime.auto_loss_scale")
    variables = auto and auto.made_any_state() and auto.state_variables()
    if variables:
        scale, skipped = float(variables[0].numpy()), int(variables[2].numpy())
        print("auto loss scale:", scale, "skipped:", skipped)
    """
)


def _run(script: Path, tmp_path: Path, env: dict[str, str]) -> str:
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    (site_dir / PTH.name).write_text(PTH.read_text())
    full_env = {k: v for k, v in os.environ.items() if k not in ALL_VARS}
    full_env.update(
        {
            "PYTHONPATH": str(REPO),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_ENABLE_ONEDNN_OPTS": "0",
            "TF_USE_LEGACY_KERAS": "1",
        }
    )
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", BOOTSTRAP, str(site_dir), str(script)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{output[-4000:]}")
    return output


def _field(out: str, name: str) -> str:
    return out.split(f"{name}:")[1].splitlines()[0].strip()


def _env_run(script: str, tmp_path: Path) -> tuple[str, set[str]]:
    logs = tmp_path / "logs"
    out = _run(
        EXAMPLES / script,
        tmp_path,
        {"TF_ENABLE_AUTO_MIXED_PRECISION": "1", "TF_AMP_LOG_PATH": str(logs)},
    )
    assert _field(out, "keras") == "tf_keras"  # the script really ran Keras 2
    assert "loss scaling: on" in out
    losses = json.loads(_field(out, "losses"))
    assert losses[-1] < 0.5 * losses[0]
    return out, _half_ops_in_logs(logs)


def test_env_tf_keras_fit_script(tmp_path: Path) -> None:
    out, half = _env_run("tf_keras_fit.py", tmp_path)
    assert _field(out, "optimizer") == "TfKerasLossScaleOptimizer"  # compile wrapped it
    assert {"Conv2D", "Conv2DBackpropFilter", "FusedBatchNormV3", "MatMul"} <= half
    assert float(_field(out, "accuracy")) > 0.9
    assert _field(out, "predictions") == "float32"


def test_env_tf_keras_custom_train_step_script(tmp_path: Path) -> None:
    out, half = _env_run("tf_keras_train_step.py", tmp_path)
    # Its own optimizer (an unmodified train_step never calls get_scaled_loss); tape.gradient
    # was scaled and apply_gradients checked, with the process-wide custom-loop scale.
    assert _field(out, "optimizer") == "Adam"
    assert {"Conv2D", "Conv2DBackpropFilter", "MatMul"} <= half
    assert "auto loss scale: 32768.0 skipped: 0" in out
    assert float(_field(out, "accuracy")) > 0.9


def test_env_tf_keras_tape_loop_script(tmp_path: Path) -> None:
    out, half = _env_run("tf_keras_tape_loop.py", tmp_path)
    assert _field(out, "optimizer") == "Adam"
    assert "MatMul" in half
    assert "auto loss scale: 32768.0 skipped: 0" in out
    assert int(_field(out, "iterations")) == 64


def test_env_tf_keras_overflow_is_skipped_in_an_unmodified_loop(tmp_path: Path) -> None:
    script = tmp_path / "overflow.py"
    script.write_text(
        textwrap.dedent(
            """
            import numpy as np, tensorflow as tf
            model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
            opt = tf.keras.optimizers.SGD(0.1)
            x = tf.ones((4, 2))

            @tf.function
            def step(x, factor):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(model(x)) * factor
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

            step(x, tf.constant(1.0))
            before = [w.numpy().tobytes() for w in model.weights]
            step(x, tf.constant(float("inf")))
            print("unchanged:", before == [w.numpy().tobytes() for w in model.weights])
            print("iterations:", int(opt.iterations))
            """
        )
    )
    out = _run(script, tmp_path, {"TF_ENABLE_AUTO_MIXED_PRECISION": "1"})
    assert "unchanged: True" in out
    assert "iterations: 1" in out
    assert "auto loss scale: 16384.0 skipped: 1" in out


SCALES_ITS_OWN_LOSS = textwrap.dedent(
    """
    import numpy as np, tensorflow as tf
    import tf_amp
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((64, 16), dtype=np.float32))
    y = tf.constant(rng.random((64, 1), dtype=np.float32))
    for wrapper in ("tf_keras", "tf_amp"):
        for kind in ("current", "legacy"):
            tf.keras.utils.set_random_seed(0)
            model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu",
                                                               input_shape=(16,)),
                                         tf.keras.layers.Dense(1)])
            inner = (tf.keras.optimizers.legacy.SGD(0.01) if kind == "legacy"
                     else tf.keras.optimizers.SGD(0.01))
            opt = (tf.keras.mixed_precision.LossScaleOptimizer(inner) if wrapper == "tf_keras"
                   else tf_amp.LossScaleOptimizer(inner))

            @tf.function
            def step():
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(x) - y) ** 2)
                    scaled = opt.get_scaled_loss(loss)
                grads = opt.get_unscaled_gradients(
                    tape.gradient(scaled, model.trainable_variables))
                opt.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            losses = [float(step()) for _ in range(20)]
            print(f"{wrapper} {kind} iterations:", int(inner.iterations),
                  "falls:", losses[-1] < 0.5 * losses[0])
    """
)


def test_env_leaves_a_loss_the_script_scales_itself_to_its_wrapper(tmp_path: Path) -> None:
    """tf_keras's own LossScaleOptimizer and tf_amp's, in a loop that scales its loss itself:
    the environment's tape patch does not scale it again (the automatic scale is never made),
    so the wrapper skips only its own first overflows, if any."""
    script = tmp_path / "scales_itself.py"
    script.write_text(SCALES_ITS_OWN_LOSS)
    out = _run(script, tmp_path, {"TF_ENABLE_AUTO_MIXED_PRECISION": "1"})
    assert "auto loss scale:" not in out
    for wrapper in ("tf_keras", "tf_amp"):
        for kind in ("current", "legacy"):
            fields = _field(out, f"{wrapper} {kind} iterations").split()
            assert int(fields[0]) >= 18 and fields[-1] == "True", out[-3000:]


OWN_STEPS_THROUGH_MINIMIZE = textwrap.dedent(
    """
    import numpy as np, tensorflow as tf

    def run(kind, legacy):
        class Model(tf.keras.Sequential):
            def train_step(self, data):
                if kind == "super":
                    return super().train_step(data)
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compiled_loss(y, self(x, training=True))
                self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
                return {"loss": loss}

        tf.keras.utils.set_random_seed(1)
        model = Model([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                       tf.keras.layers.Dense(1)])
        optimizers = tf.keras.optimizers.legacy if legacy else tf.keras.optimizers
        # 1e-8 x mse at a learning rate of 1e6: float16 gradients underflow unless scaled
        model.compile(optimizer=optimizers.SGD(1e6),
                      loss=lambda y, p: tf.reduce_mean(tf.square(y - p), axis=-1) * 1e-8)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(64, 8)).astype(np.float32)
        y = x @ rng.normal(size=(8, 1)).astype(np.float32)
        before = model.layers[0].kernel.numpy()
        model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
        moved = float(np.abs(model.layers[0].kernel.numpy() - before).sum())
        print(f"{kind} {'legacy' if legacy else 'current'}:", type(model.optimizer).__name__,
              int(model.optimizer.iterations), round(moved, 3))

    for kind in ("super", "minimize"):
        for legacy in (False, True):
            run(kind, legacy)
    """
)


def test_env_scales_an_own_step_that_calls_super_or_minimize(tmp_path: Path) -> None:
    """A step of the model's own that calls ``super().train_step(data)``, or the optimizer's
    ``minimize(loss, vars, tape=tape)``: compile leaves the optimizer unwrapped (an own step
    need not call ``get_scaled_loss``), and ``tape.gradient`` is called from tf_keras's
    optimizer, which the patch took for library code. Nothing scaled those steps: the float16
    gradients underflowed and the model never moved (0.0). Now they are scaled there."""
    script = tmp_path / "own_steps.py"
    script.write_text(OWN_STEPS_THROUGH_MINIMIZE)
    float32 = _run(script, tmp_path, {})
    mixed = _run(script, tmp_path, {"TF_ENABLE_AUTO_MIXED_PRECISION": "1"})
    for kind in ("super current", "super legacy", "minimize current", "minimize legacy"):
        name, iterations, moved = _field(mixed, kind).split()
        expected = float(_field(float32, kind).split()[2])
        assert name == "SGD" and iterations == "12"
        assert abs(float(moved) - expected) < 0.25 * expected, (kind, moved, expected)
    assert "auto loss scale: 32768.0 skipped: 0" in mixed

MIRRORED = textwrap.dedent(
    """
    import json, os
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    import tf_keras
    import tf_amp
    from tf_amp.loss_scale import DynamicLossScale

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    POISON = {2: float("inf"), 5: float("nan"), 6: float("inf")}
    x = tf.constant(np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3))
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    facts = {}
    for kind in ("current", "legacy"):
        with strategy.scope():
            tf_keras.utils.set_random_seed(0)
            model = tf_keras.Sequential([tf_keras.Input((3,)),
                                         tf_keras.layers.Dense(4, activation="tanh"),
                                         tf_keras.layers.Dense(1)])
            inner = (tf_keras.optimizers.legacy.Adam(0.01) if kind == "legacy"
                     else tf_keras.optimizers.Adam(0.01))
            opt = tf_amp.LossScaleOptimizer(inner, DynamicLossScale(2.0**8, growth_interval=3))

        @tf.function
        def step(bad):
            def replica_fn(bad):
                context = tf.distribute.get_replica_context()
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(x) - y))
                    scaled = opt.get_scaled_loss(loss)
                grads = opt.get_unscaled_gradients(tape.gradient(scaled, model.trainable_variables))
                last = context.replica_id_in_sync_group == context.num_replicas_in_sync - 1
                poison = tf.where(last, bad, 0.0)  # only the last replica sees it
                opt.apply_gradients(zip([g + poison for g in grads], model.trainable_variables))
            strategy.run(replica_fn, args=(bad,))

        def local(v):
            return [np.array(t.numpy()).tobytes() for t in strategy.experimental_local_results(v)]

        def tracked():
            variables = opt.variables() if kind == "legacy" else opt.variables
            return [local(v) for v in model.trainable_weights + list(variables)]

        scales = []
        for i in range(8):
            before = tracked()
            step(tf.constant(POISON.get(i, 0.0)))
            after = tracked()
            assert all(len(set(r)) == 1 for r in after), "replicas diverged"
            assert (before == after) == (i in POISON), i
            scales.append(float(opt.loss_scale))
        with strategy.scope():
            fit_model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(1)])
            fit_opt = tf_amp.enable_mixed_precision_graph_rewrite(
                tf_keras.optimizers.legacy.SGD(0.1) if kind == "legacy"
                else tf_keras.optimizers.SGD(0.1))
            fit_model.compile(optimizer=fit_opt, loss="mse")
        history = fit_model.fit(x.numpy(), y.numpy(), batch_size=4, epochs=3, verbose=0)
        facts[kind] = {"scales": scales, "skipped": int(opt.skipped_steps),
                       "iterations": int(opt.iterations.numpy()),
                       "fit_iterations": int(fit_opt.iterations.numpy()),
                       "fit_losses": history.history["loss"]}
    print(json.dumps(facts))
    """
)


def test_mirrored_strategy_two_logical_cpus_agree_and_skip_together() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", MIRRORED], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    for kind in ("current", "legacy"):
        assert facts[kind]["scales"] == [256.0, 256.0, 128.0, 128.0, 128.0, 64.0, 32.0, 32.0]
        assert facts[kind]["skipped"] == 3 and facts[kind]["iterations"] == 5
        assert facts[kind]["fit_iterations"] == 6
        assert facts[kind]["fit_losses"][-1] < facts[kind]["fit_losses"][0]


SAVE_UNDER_ENV = """
    import numpy as np, tf_keras as K
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32"); y = np.arange(64) % 3
    m = K.Sequential([K.layers.Dense(16, activation="relu", input_shape=(8,)), K.layers.Dense(3)])
    m.compile(K.optimizers.Adam(1e-2), K.losses.SparseCategoricalCrossentropy(from_logits=True))
    m.fit(x, y, batch_size=8, epochs=1, verbose=0)
    print("optimizer:", type(m.optimizer).__name__)
    m.save("model.keras"); m.save("model.h5"); m.save("saved_model")
    K.saving.save_model(m, "saving.keras")  # the same function, bound in tf_keras.saving
    reloaded = K.models.load_model("model.h5")  # still under the environment
    print("h5 iterations under the environment:", int(reloaded.optimizer.iterations.numpy()))
"""

LOAD_WITHOUT_TF_AMP = """
    import sys

    class NoTfAmp:  # a machine where tf_amp is not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "tf_amp":
                raise ModuleNotFoundError(name)

    sys.meta_path.insert(0, NoTfAmp())
    import tf_keras as K
    for path in ("model.keras", "model.h5", "saved_model", "saving.keras"):
        model = K.models.load_model(path)
        print(path, type(model.optimizer).__name__, int(model.optimizer.iterations.numpy()))
"""


def test_env_files_load_where_tf_amp_is_not_installed(tmp_path: Path) -> None:
    # Saved as is, all three formats named tf_amp>TfKerasLossScaleOptimizer; an .h5 loaded
    # under the environment lost its optimizer state (the wrapper was not built).
    (tmp_path / "save.py").write_text(textwrap.dedent(SAVE_UNDER_ENV))
    (tmp_path / "load.py").write_text(textwrap.dedent(LOAD_WITHOUT_TF_AMP))
    out = _run(tmp_path / "save.py", tmp_path,
               {"TF_ENABLE_AUTO_MIXED_PRECISION": "1", "TF_AMP_TARGET_DTYPE": "float16"})
    assert _field(out, "optimizer") == "TfKerasLossScaleOptimizer"
    assert _field(out, "h5 iterations under the environment") == "8"
    loaded = _run(tmp_path / "load.py", tmp_path, {})
    assert "model.keras Adam 8" in loaded and "model.h5 Adam 8" in loaded
    assert "saving.keras Adam 8" in loaded
    assert "saved_model Adam" in loaded  # a SavedModel keeps no optimizer state in tf_keras
