"""Train a small CNN on scikit-learn's digits in float32 and in mixed precision, and compare.

The main job of tf_amp: the same Keras model, the same data, the same initial weights, trained
once in float32 and once through tf_amp (graph rewrite to float16 + dynamic loss scaling). It
prints both test accuracies, the rewrite's "Converted ..." line, the loss scale and the number of
skipped steps, and where the rewritten graphs and the TensorBoard logs were written.

    python examples/train_digits.py                       # one seed, ~1 minute on 2 cores
    python examples/train_digits.py --parity              # 3 seeds: mean and spread
    tensorboard --logdir /tmp/tf_amp_digits               # scalars and before/after graphs
    tf-amp inspect /tmp/tf_amp_digits/seed0/mixed/graphs  # what was converted and why

The digits data (1,797 8x8 images, 10 classes) ships with scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 25, "Training epochs per run.")
flags.DEFINE_integer("batch_size", 32, "Batch size.")
flags.DEFINE_float("learning_rate", 2e-3, "Adam learning rate.")
flags.DEFINE_integer("seed", 0, "Seed for the split, the initial weights and the shuffling.")
flags.DEFINE_bool("parity", False, "Convergence parity: 3 seeds, mean and spread of accuracy.")
flags.DEFINE_integer("parity_seeds", 3, "How many seeds --parity runs.")
flags.DEFINE_string("logdir", "/tmp/tf_amp_digits", "TensorBoard logs and rewritten graphs.")
flags.DEFINE_integer("steps_per_execution", 1, "Batches per call of the train function.")
flags.DEFINE_bool("progress", True, "Show a progress bar.")


@dataclass
class RunResult:
    """What one training run reports."""

    accuracy: float
    seconds: float
    summary: str = ""
    loss_scale: float | None = None
    skipped_steps: int | None = None
    half_ops: int = 0


def load_data(seed: int) -> tuple[Any, Any, Any, Any]:
    """Digits as (N, 8, 8, 1) float32 in [0, 1]; a stratified 80/20 split."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    return train_test_split(
        images,
        digits.target.astype(np.int32),
        test_size=0.2,
        random_state=seed,
        stratify=digits.target,
    )


def build_model(seed: int) -> Any:
    """A small CNN; seeded so the float32 and mixed-precision runs start from the same weights."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    x = keras.layers.Dropout(0.25, seed=seed)(x)
    outputs = keras.layers.Dense(10)(x)
    return keras.Model(inputs, outputs, name="digits_cnn")


class ProgressBar:
    """One progress bar per run (Keras's Progbar, stepped per epoch) as a Keras callback."""

    def __new__(cls, title: str, epochs: int) -> Any:
        import keras

        class _Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs: Any = None) -> None:
                print(title, flush=True)
                self.bar = keras.utils.Progbar(epochs, stateful_metrics=["loss", "accuracy"])

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                logs = logs or {}
                self.bar.update(
                    epoch + 1, [(k, float(logs[k])) for k in ("loss", "accuracy") if k in logs]
                )

        return _Callback()


def train(mixed: bool, seed: int, data: tuple[Any, Any, Any, Any], logdir: str) -> RunResult:
    """Trains one model (float32, or through tf_amp) and evaluates it on the test split."""
    import keras

    import tf_amp
    from tf_amp.config import RewriteConfig
    from tf_amp.runtime import keras_fit

    x_train, x_test, y_train, y_test = data
    model = build_model(seed)
    steps = FLAGS.epochs * -(-len(x_train) // FLAGS.batch_size)
    # Cosine decay to zero: the final weights settle, so the test accuracy measures the
    # precision, not where in its last oscillation the run happened to stop.
    schedule = keras.optimizers.schedules.CosineDecay(FLAGS.learning_rate, steps)
    optimizer: Any = keras.optimizers.Adam(schedule)
    if mixed:
        optimizer = tf_amp.enable_mixed_precision_graph_rewrite(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=False,  # see README: XLA needs the fused op's XLA fallback
        steps_per_execution=FLAGS.steps_per_execution,
    )
    if mixed:
        # fit/evaluate run the rewritten step; the rewritten graphs go to the log dir.
        keras_fit.install(model, config=RewriteConfig.from_env(log_dir=f"{logdir}/graphs"))
    callbacks: list[Any] = []
    if tensorboard_available():
        callbacks.append(keras.callbacks.TensorBoard(logdir, histogram_freq=0))
    if FLAGS.progress:
        name = "mixed precision" if mixed else "float32"
        callbacks.append(ProgressBar(f"[seed {seed}] {name}", FLAGS.epochs))
    start = time.perf_counter()
    model.fit(
        x_train,
        y_train,
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        verbose=0,
        shuffle=True,
        callbacks=callbacks,
    )
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    result = RunResult(accuracy=float(accuracy), seconds=seconds)
    if mixed:
        step = keras_fit.rewritten_functions(model)["train"]
        result.summary = step.reports[0].summary_line() if step.reports else "(no report)"
        result.half_ops = count_half_ops(step)
        result.loss_scale = float(optimizer.loss_scale)
        result.skipped_steps = int(optimizer.skipped_steps)
    return result


def tensorboard_available() -> bool:
    """Keras's TensorBoard callback needs the tensorboard package (tf.summary's backend)."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def count_half_ops(step: Any) -> int:
    """Ops computing in float16 in the graph the rewritten train step actually runs."""
    from tensorflow.core.framework import types_pb2

    total = 0
    for concrete in step.concrete_functions():
        for node in concrete.graph.as_graph_def().node:
            if (
                any(
                    attr.type == types_pb2.DT_HALF
                    for key, attr in node.attr.items()
                    if key in ("T", "DstT")
                )
                and node.op != "Cast"
            ):
                total += 1
    return total


def run_once(seed: int, logdir: str) -> tuple[RunResult, RunResult]:
    data = load_data(seed)
    fp32 = train(False, seed, data, f"{logdir}/seed{seed}/float32")
    amp = train(True, seed, data, f"{logdir}/seed{seed}/mixed")
    return fp32, amp


def report(fp32: RunResult, amp: RunResult, logdir: str, seed: int) -> None:
    print()
    print(f"float32         test accuracy: {fp32.accuracy:.4f}   ({fp32.seconds:.1f} s)")
    print(f"mixed precision test accuracy: {amp.accuracy:.4f}   ({amp.seconds:.1f} s)")
    print(f"rewrite: {amp.summary}")
    print(f"float16 ops in the executed train step: {amp.half_ops}")
    print(f"loss scale: {amp.loss_scale:g}   skipped steps: {amp.skipped_steps}")
    graphs = f"{logdir}/seed{seed}/mixed/graphs"
    print(f"rewritten graphs (before/after .pb/.pbtxt, decisions): {graphs}")
    print(f"  what changed and why: tf-amp inspect {graphs}")
    print(f"  graph view: tensorboard --logdir {graphs}/tensorboard")
    if tensorboard_available():
        print(f"TensorBoard training logs: tensorboard --logdir {logdir}")
    else:
        print("TensorBoard training logs: not written (pip install tensorboard to get them)")


def main(argv: list[str]) -> int:
    del argv
    if not FLAGS.parity:
        fp32, amp = run_once(FLAGS.seed, FLAGS.logdir)
        report(fp32, amp, FLAGS.logdir, FLAGS.seed)
        return 0
    seeds = list(range(FLAGS.seed, FLAGS.seed + FLAGS.parity_seeds))
    results = [run_once(seed, FLAGS.logdir) for seed in seeds]
    fp32 = [r[0].accuracy for r in results]
    amp = [r[1].accuracy for r in results]
    print()
    print(f"convergence parity over seeds {seeds}")
    for seed, (a, b) in zip(seeds, zip(fp32, amp, strict=True), strict=True):
        print(f"  seed {seed}: float32 {a:.4f}   mixed {b:.4f}   diff {100 * (b - a):+.2f} points")
    spread = statistics.pstdev
    print(f"  float32 mean {statistics.mean(fp32):.4f}  spread (std) {spread(fp32):.4f}")
    print(f"  mixed   mean {statistics.mean(amp):.4f}  spread (std) {spread(amp):.4f}")
    gap = 100 * (statistics.mean(amp) - statistics.mean(fp32))
    print(f"  mean difference: {gap:+.2f} points (goal: within 1 point)")
    print(f"  last run: {results[-1][1].summary}")
    return 0 if abs(gap) <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(app.run(main))
