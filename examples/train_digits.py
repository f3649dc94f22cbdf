"""Train a CNN on scikit-learn's digits in float32 and in mixed precision, and compare.

The main job of tf_amp: the same Keras model, the same data, the same initial weights, trained
once in float32 and once through tf_amp, with the target tf_amp picks for this machine
(``tf_amp.hardware``: float16 with dynamic loss scaling on a CUDA GPU, bfloat16 on a CPU with
AMX-BF16 or AVX512-BF16, float32 where neither is fast). It prints the target and why, both
test accuracies, the step-time ratio of the two runs, the rewrite's "Converted ..." line, the
ops that ran in reduced precision, the loss scale and skipped steps (when scaling is on), and
where the rewritten graphs and the TensorBoard logs were written. Where tf_amp keeps float32
(a CPU with no fast reduced precision), the second run is what tf_amp's default does there,
the float32 graph unchanged: the report says so, what it cost, and how to force a target.

    python examples/train_digits.py                       # one seed: ~1.5 minutes on a 2-core
                                                          # AVX512 EPYC, ~5 on an AVX2 one
    python examples/train_digits.py --parity              # 3 seeds: mean and spread
    TF_AMP_TARGET_DTYPE=float16 python examples/train_digits.py   # force a target
    tensorboard --logdir /tmp/tf_amp_digits               # scalars and before/after graphs
    tf-amp inspect /tmp/tf_amp_digits/seed0/mixed/graphs  # what was converted and why

The digits data (1,797 8x8 images, 10 classes) ships with scikit-learn: nothing is downloaded.
The images are upscaled to 32x32 (``--image_size``) so that a step does real convolution work:
at 8x8 a step is all per-op overhead, which no precision changes.
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
flags.DEFINE_integer("epochs", 8, "Training epochs per run.")
flags.DEFINE_integer("batch_size", 64, "Batch size.")
flags.DEFINE_integer("image_size", 32, "Images are upscaled from 8x8 to this size (multiple of 8).")
# 64, not 32: measured on a quiet 2-core AVX512-BF16 EPYC, at width 32 both runs took ~1.25 s
# an epoch (per-step costs other than the convolutions dominate), at 64 bfloat16 took 0.61x
# float32's epoch time.
flags.DEFINE_integer("width", 64, "Filters of the first convolutions (doubled after a pooling).")
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
    epoch_seconds: float = 0.0  # median epoch time after the first (tracing, rewriting)
    target: str = ""
    target_reason: str = ""


def load_data(seed: int) -> tuple[Any, Any, Any, Any]:
    """Digits as (N, S, S, 1) float32 in [0, 1], S = ``--image_size``; a stratified 80/20
    split."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    if FLAGS.image_size % 8:
        raise app.UsageError(f"--image_size must be a multiple of 8, got {FLAGS.image_size}")
    block = np.ones((FLAGS.image_size // 8,) * 2, np.float32)
    images = np.kron((digits.images / 16.0).astype(np.float32), block)[..., None]
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
    size, width = FLAGS.image_size, FLAGS.width
    inputs = keras.Input((size, size, 1))
    x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(2 * width, 3, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(2 * width, 3, padding="same", activation="relu")(x)
    if size > 8:
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(256, activation="relu")(x)
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


class EpochTimer:
    """Wall time of each epoch (a Keras callback), so the speed figure can leave out the
    first epoch, which also traces and rewrites the step."""

    def __new__(cls) -> Any:
        import keras

        class _Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self.start = time.perf_counter()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                self.seconds.append(time.perf_counter() - self.start)

        callback = _Callback()
        callback.seconds = []
        return callback


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
    config = RewriteConfig.from_env(log_dir=f"{logdir}/graphs") if mixed else None
    if config is not None and config.rewrites:
        # fit/evaluate run the rewritten step; the rewritten graphs go to the log dir. (With a
        # float32 target there is nothing to rewrite: fit runs Keras's own step, as it does for
        # a user of enable_mixed_precision_graph_rewrite on this machine.)
        keras_fit.install(model, config=config)
    timer = EpochTimer()
    callbacks: list[Any] = [timer]
    if tensorboard_available():
        callbacks.append(keras.callbacks.TensorBoard(logdir, histogram_freq=0))
    if FLAGS.progress:
        name = run_name(config.target_dtype) if config is not None else "float32"
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
    later = timer.seconds[1:] or timer.seconds
    result = RunResult(
        accuracy=float(accuracy), seconds=seconds, epoch_seconds=statistics.median(later)
    )
    if config is not None:
        result.target, result.target_reason = config.target_dtype, config.target_reason
        if config.rewrites:
            step = keras_fit.rewritten_functions(model)["train"]
            report = step.reports[0] if step.reports else None
            result.summary = report.summary_line() if report and report.changed else "(unchanged)"
            result.half_ops = count_half_ops(step)
        if optimizer.enabled:
            result.loss_scale = float(optimizer.loss_scale)
            result.skipped_steps = int(optimizer.skipped_steps)
    return result


def run_name(target: str) -> str:
    """What the second run is called: mixed precision, unless tf_amp kept float32 here."""
    return "mixed precision" if target != "float32" else "tf_amp, float32"


def tensorboard_available() -> bool:
    """Keras's TensorBoard callback needs the tensorboard package (tf.summary's backend)."""
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def count_half_ops(step: Any) -> int:
    """Ops computing in float16 or bfloat16 in the graph the train step actually runs (the
    proof that reduced precision ran, read from the executed graph's dtypes)."""
    from tensorflow.core.framework import types_pb2

    reduced = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16)
    total = 0
    for concrete in step.rewritten_concrete_functions():
        for node in concrete.graph.as_graph_def().node:
            if node.op != "Cast" and any(
                attr.type in reduced for key, attr in node.attr.items() if key in ("T", "DstT")
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
    print(f"target: {amp.target} ({amp.target_reason})")
    name = run_name(amp.target)
    print(f"float32         test accuracy: {fp32.accuracy:.4f}   ({fp32.seconds:.1f} s)")
    print(f"{name:<15} test accuracy: {amp.accuracy:.4f}   ({amp.seconds:.1f} s)")
    ratio = amp.epoch_seconds / fp32.epoch_seconds
    which = "first epoch left out" if FLAGS.epochs > 1 else "the only epoch, tracing included"
    print(
        f"epoch time, {which}: float32 {fp32.epoch_seconds:.2f} s, {name} "
        f"{amp.epoch_seconds:.2f} s: {ratio:.2f}x float32 ({1 / ratio:.2f}x as fast)"
    )
    if amp.target == "float32":
        # Nothing was converted: say so, and how to see the rewrite anyway, instead of pointing
        # at graphs that were never written.
        print("rewrite: none: no reduced precision is faster than float32 on this machine, so "
              "tf_amp trained the float32 graph unchanged (the epoch-time ratio above is what "
              "its default costs here)")
        print("  to see the rewrite anyway (slower here): TF_AMP_TARGET_DTYPE=bfloat16 python "
              "examples/train_digits.py")
    else:
        print(f"rewrite: {amp.summary}")
        print(f"reduced-precision ops in the executed train step: {amp.half_ops}")
    if amp.loss_scale is None:
        print(f"loss scale: off ({amp.target} needs none)")
    else:
        print(f"loss scale: {amp.loss_scale:g}   skipped steps: {amp.skipped_steps}")
    if amp.target != "float32":
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
