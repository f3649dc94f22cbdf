"""Real-model corpus: keras.applications train steps against TensorFlow's GPU pass and Keras.

For each architecture (the smallest of its family that builds with ``weights=None``), on
32x32 inputs, batch 8, 10 classes, dropout rates set to 0 (so that the three runs below see
the same function; BatchNorm runs in training mode):

1. The SGD-momentum train step's GraphDef, rewritten by tf_amp's default (``check_kernels``
   off, see tests/test_differential_gpu.py for why) and by TensorFlow 2.21's real GPU pass
   (CUDA build, ``tests/_gpu_oracle.py``): float32 vertices, vertices that differ by reason
   (``classify`` in ``tests/_oracle.py``), new Casts (to half / to float32) on both sides.
2. Train steps from the same weights: float32, tf_amp (``tf_amp.function`` +
   ``tf_amp.LossScaleOptimizer``, dynamic scale) and Keras's own ``mixed_float16`` policy
   with ``keras.optimizers.LossScaleOptimizer``: the first-step loss on ``--first-batches``
   batches (weights reset before each), its mean distance from float32's, then ``--steps``
   steps in a row; the steps each skipped (Keras's: the steps where its scale fell).

Usage: ``python bench/corpus.py [--models resnet50,...] [--steps 3] [--first-batches 4]``.
Prints one table.
Without the oracle venv (scripts/make_oracle_venv.sh) the comparison columns say so.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_amp  # noqa: E402
from tests import _gpu_oracle, _model_graphs, _oracle  # noqa: E402
from tf_amp.config import RewriteConfig  # noqa: E402
from tf_amp.rewriter import rewrite_graph_def  # noqa: E402

BATCH, SIZE, CLASSES = 8, 32, 10

ARCHITECTURES: dict[str, tuple[Callable[..., keras.Model], dict[str, Any]]] = {
    "resnet50": (keras.applications.ResNet50, {}),
    "mobilenet_v2": (keras.applications.MobileNetV2, {"alpha": 0.35}),
    "efficientnet_b0": (keras.applications.EfficientNetB0, {}),
    "densenet121": (keras.applications.DenseNet121, {}),
}


def build(name: str, policy: str | None = None) -> keras.Model:
    """The architecture with seed-0 weights; under ``policy`` when given (then reset)."""
    fn, kwargs = ARCHITECTURES[name]
    old = keras.config.dtype_policy()
    if policy:
        keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = fn(input_shape=(SIZE, SIZE, 3), weights=None, classes=CLASSES,
                   classifier_activation=None, **kwargs)
    finally:
        keras.config.set_dtype_policy(old)
    for layer in model.layers:  # same function in all runs: no random dropout masks
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0
    return model


def batch() -> tuple[np.ndarray, np.ndarray]:
    return _batches(1)[0]


@dataclass
class Row:
    name: str
    nodes: int = 0
    vertices: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    casts_ours: dict[str, int] = field(default_factory=dict)
    casts_tf: dict[str, int] = field(default_factory=dict)
    casts_at_lists: dict[str, int] = field(default_factory=dict)
    rewrite_s: float = 0.0
    losses_f32: list[float] = field(default_factory=list)
    losses_amp: list[float] = field(default_factory=list)
    losses_keras: list[float] = field(default_factory=list)
    skips_amp: int = 0
    skips_keras: int = 0
    scale_amp: float = 0.0
    scale_keras: float = 0.0
    step_s: dict[str, float] = field(default_factory=dict)
    comparison: Any = None
    buckets: dict[str, list] = field(default_factory=dict)
    rewrite: Any = None
    graph: Any = None


def compare_with_gpu_pass(name: str, row: Row) -> None:
    """Fills the graph columns of ``row``: our default vs TensorFlow's GPU pass."""
    model = build(name)
    x, y = batch()
    graph = _model_graphs._train_step_graph(name, model, x.shape, lambda: tf.constant(y))
    row.graph = graph
    row.nodes = len(graph.graph_def.node)
    start = time.perf_counter()
    result = rewrite_graph_def(
        graph.graph_def, RewriteConfig(preserve_nodes=frozenset(graph.fetches),
                                       check_kernels=False)
    )
    row.rewrite_s = time.perf_counter() - start
    row.rewrite = result
    theirs, _ = _gpu_oracle.run_gpu_pass(graph.graph_def, graph.fetches)
    comparison = _oracle.compare(graph.graph_def, result.graph_def, theirs)
    buckets = _oracle.classify(result, comparison)
    row.comparison, row.buckets = comparison, buckets
    row.vertices = comparison.vertices
    row.reasons = {k: len(v) for k, v in buckets.items() if v}
    row.casts_ours, row.casts_tf = comparison.ours_casts, comparison.tf_casts
    row.casts_at_lists = _oracle.list_boundary_casts(graph.graph_def, result.graph_def, buckets)


def _loss_fn() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _batches(k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((BATCH, SIZE, SIZE, 3)).astype(np.float32),
             rng.integers(0, CLASSES, BATCH).astype(np.int32)) for _ in range(k)]


def _drive(step: Callable, model: keras.Model, weights: list, batches: list,
           steps: int) -> tuple[list[float], float]:
    """First-step losses: each batch from ``weights`` (reset before every call, so each loss
    is a first step); then ``steps`` steps on batch 0 in a row. Returns (losses, s/step)."""
    losses = []
    for x, y in batches:
        model.set_weights(weights)
        losses.append(float(step(x, y)))
    model.set_weights(weights)
    start = time.perf_counter()
    for _ in range(steps):
        step(*batches[0])
    return losses, (time.perf_counter() - start) / max(steps, 1)


def run_steps(name: str, row: Row, steps: int, first_batches: int = 4) -> None:
    """Fills the numeric columns: first-step losses on ``first_batches`` batches (each from
    the same weights) and skips over all the steps, for float32, tf_amp and Keras.

    Several batches, because one scalar is noise here: at batch 8 BatchNorm's statistics over
    the last 1x1 feature maps amplify any rounding, so every mixed run (Keras's too) moves the
    logits by up to ~0.5 on MobileNetV2, and one batch's loss may land near float32's by luck.
    """
    batches = _batches(first_batches)
    loss_fn = _loss_fn()
    model = build(name)
    weights = model.get_weights()
    opt = keras.optimizers.SGD(0.01, momentum=0.9)

    @tf.function
    def f32_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    row.losses_f32, row.step_s["float32"] = _drive(f32_step, model, weights, batches, steps)

    model = build(name)
    amp_opt = tf_amp.LossScaleOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))

    # float16, the target TensorFlow's GPU pass and Keras's mixed_float16 are compared on,
    # whatever "auto" would pick on the machine running the bench.
    @tf_amp.function(config=RewriteConfig.from_env(target_dtype="float16"))
    def amp_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = amp_opt.get_scaled_loss(loss)
        grads = amp_opt.get_unscaled_gradients(
            tape.gradient(scaled, model.trainable_variables))
        amp_opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    row.losses_amp, row.step_s["tf_amp"] = _drive(amp_step, model, weights, batches, steps)
    row.skips_amp = int(amp_opt.skipped_steps)
    row.scale_amp = float(amp_opt.loss_scale)

    model = build(name, policy="mixed_float16")
    k_opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
    k_opt.build(model.trainable_variables)
    scales: list[float] = []

    @tf.function
    def keras_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            scaled = k_opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        k_opt.apply(grads, model.trainable_variables)
        return loss

    def counted(x: np.ndarray, y: np.ndarray) -> tf.Tensor:
        before = float(k_opt.dynamic_scale)
        loss = keras_step(x, y)
        scales.append(float(k_opt.dynamic_scale) < before)  # Keras halves on a skip
        return loss

    row.losses_keras, row.step_s["keras_mp16"] = _drive(counted, model, weights, batches, steps)
    row.skips_keras = int(sum(scales))
    row.scale_keras = float(k_opt.dynamic_scale)


def mean_abs_delta(losses: list[float], reference: list[float]) -> float:
    """Mean |loss - float32 loss| over the first-step batches."""
    return float(np.mean(np.abs(np.subtract(losses, reference))))


def measure(name: str, steps: int = 3, compare: bool = True, first_batches: int = 4) -> Row:
    row = Row(name)
    if compare and _gpu_oracle.oracle_python() is not None:
        compare_with_gpu_pass(name, row)
    run_steps(name, row, steps, first_batches)
    return row


def _dirs(d: dict[str, int]) -> str:
    return f"{d.get('to_half', 0)}/{d.get('to_float', 0)}" if d else "-"


def print_table(rows: list[Row], steps: int) -> None:
    print(f"\nbatch {BATCH}, {SIZE}x{SIZE}x3, {CLASSES} classes; casts: to half / to float32; "
          "|d| = mean over the first-step batches of |loss - float32's|; skips over those "
          f"first steps + {steps} steps; final scales")
    head = ("model", "nodes", "vertices", "differ (reason)", "casts ours", "TF GPU pass",
            "ours at lists", "rewrite s", "loss f32", "|d| tf_amp", "|d| keras mp16",
            "skips amp/keras", "scale amp/keras", "step s f32/amp/keras")
    print(" | ".join(head))
    for r in rows:
        reasons = ", ".join(f"{k}={v}" for k, v in r.reasons.items()) or "0"
        print(" | ".join([
            r.name, str(r.nodes), str(r.vertices), reasons, _dirs(r.casts_ours),
            _dirs(r.casts_tf), _dirs(r.casts_at_lists), f"{r.rewrite_s:.2f}",
            f"{np.mean(r.losses_f32):.4f}",
            f"{mean_abs_delta(r.losses_amp, r.losses_f32):.2e}",
            f"{mean_abs_delta(r.losses_keras, r.losses_f32):.2e}",
            f"{r.skips_amp}/{r.skips_keras}", f"{r.scale_amp:g}/{r.scale_keras:g}",
            "/".join(f"{r.step_s.get(k, 0.0):.2f}" for k in ("float32", "tf_amp", "keras_mp16")),
        ]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(ARCHITECTURES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--first-batches", type=int, default=4)
    parser.add_argument("--no-compare", action="store_true", help="skip the GPU-pass columns")
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        start = time.perf_counter()
        rows.append(measure(name, args.steps, not args.no_compare, args.first_batches))
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    print_table(rows, args.steps)


if __name__ == "__main__":
    main()
