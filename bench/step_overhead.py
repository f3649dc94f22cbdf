"""Train-step overhead of loss scaling: plain Adam vs tf_amp's wrapper vs Keras's wrapper.

One small Keras CNN is trained by Keras's own train function (``steps_per_execution``
steps per call, as ``fit`` runs it) with three optimizers in the same process; rounds are
interleaved (A, B, C, A, B, C, ...) so drift on a shared machine hits all three alike. The
ratios use the fastest round of each (like ``timeit``: on a shared machine the minimum is the
least disturbed estimate); medians are printed beside them.
Goal: tf_amp adds <= 2% over plain Adam and is faster than keras.optimizers.LossScaleOptimizer.

    python bench/step_overhead.py [--steps 10] [--rounds 15] [--batch 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_amp  # noqa: E402


def cnn() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )


def deep_mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(32, activation="relu") for _ in range(60)]
    return keras.Sequential([keras.Input((32,)), *layers, keras.layers.Dense(10)])


def optimizers() -> dict[str, keras.optimizers.Optimizer]:
    return {
        "adam": keras.optimizers.Adam(1e-3),
        "tf_amp": tf_amp.LossScaleOptimizer(keras.optimizers.Adam(1e-3)),
        "keras_lso": keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="train steps per timed round")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per optimizer")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch * args.steps, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=(args.batch * args.steps,))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).cache().repeat()

    models, iterators = {}, {}
    for name, optimizer in optimizers().items():
        model = cnn()
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=args.steps,  # one call = args.steps steps in a graph loop
        )
        model.make_train_function()
        iterators[name] = iter(data)
        model.train_function(iterators[name])  # trace + warm up
        models[name] = model

    # Calling the train function directly (what fit() does per execution) keeps fit's Python
    # bookkeeping out of the numbers.
    times: dict[str, list[float]] = {name: [] for name in models}
    cpu: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            float(model.train_function(iterators[name])["loss"])
            times[name].append((time.perf_counter() - start) / args.steps)
            cpu[name].append((time.process_time() - start_cpu) / args.steps)

    print(
        f"native op available: {tf_amp.native_op_available()} "
        "(False: tf_amp uses its pure-TF fallback)"
    )
    print(
        f"CNN 32x32x3, batch {args.batch}, {args.rounds} rounds x {args.steps} steps, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
        "(shared machine: compare ratios, not times)"
    )
    best = {name: min(samples) for name, samples in times.items()}
    median = {name: statistics.median(samples) for name, samples in times.items()}
    for name in times:
        print(
            f"{name:>10}: best {best[name] * 1e3:7.2f} ms/step  ratio "
            f"{best[name] / best['adam']:.3f}"
            f"   median {median[name] * 1e3:7.2f} ms/step  ratio "
            f"{median[name] / median['adam']:.3f}"
        )
    # CPU seconds of this process per step: less sensitive to other processes than wall time.
    cpu_median = {name: statistics.median(samples) for name, samples in cpu.items()}
    print(
        "process CPU time per step (median), ratio vs adam: "
        + "  ".join(f"{n} {cpu_median[n] / cpu_median['adam']:.3f}" for n in cpu_median)
    )
    overhead = 100 * (best["tf_amp"] / best["adam"] - 1)
    print(f"tf_amp overhead over adam (best): {overhead:+.1f}%  (goal <= +2%)")
    print(f"tf_amp / keras_lso (best): {best['tf_amp'] / best['keras_lso']:.3f}  (goal < 1)")
    optimizer_step_only(models, x[: args.batch], y[: args.batch], args.rounds)
    ops_per_applied_step(models)

    # Many small tensors (a 61-layer MLP, 122 gradients): Keras checks each gradient with its
    # own ops, tf_amp with one fused op, so the gap grows with the parameter list.
    deep_models = {}
    for name, optimizer in optimizers().items():
        model = deep_mlp()
        model.compile(optimizer=optimizer, loss="mse")
        deep_models[name] = model
    x_deep = rng.normal(size=(args.batch, 32)).astype("float32")
    print("deep MLP, 122 gradients:")
    optimizer_step_only(
        deep_models,
        x_deep,
        rng.integers(0, 10, size=(args.batch,)),
        max(3, args.rounds // 3),
        calls=20,
    )
    ops_per_applied_step(deep_models)


def optimizer_step_only(
    models: dict[str, keras.Model], x: np.ndarray, y: np.ndarray, rounds: int, calls: int = 100
) -> None:
    """Times ``optimizer.apply`` alone on the CNN's gradients, ``calls`` applies in one graph
    loop: the in-graph overhead in microseconds, free of the forward/backward pass that
    dominates (and blurs) the full-step ratio and of the per-call function overhead."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    steps = {}
    for name, model in models.items():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)

        @tf.function
        def step(g: list[tf.Tensor], m: keras.Model = model) -> tf.Tensor:
            for _ in tf.range(calls):
                m.optimizer.apply(g, m.trainable_variables)
            return tf.constant(0)

        step(grads)
        steps[name] = (step, grads)
    best = {name: float("inf") for name in steps}
    for _ in range(rounds):
        for name, (step, grads) in steps.items():
            start = time.perf_counter()
            step(grads).numpy()
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    print(f"optimizer.apply alone, {calls} per graph loop (best round):")
    for name, seconds in best.items():
        extra = (seconds - best["adam"]) * 1e6
        print(f"{name:>10}: {seconds * 1e6:8.1f} us/apply   {extra:+7.1f} us vs adam")


def _count_ops(nodes: Any, library: dict[str, Any]) -> int:
    total = 0
    for node in nodes:
        if node.op in ("Placeholder", "Const", "NoOp"):
            continue
        total += 1
        if node.op in ("If", "StatelessIf"):  # an applied step runs the then-branch
            total += _count_ops(library[node.attr["then_branch"].func.name].node_def, library)
        if node.op in ("StatefulPartitionedCall", "PartitionedCall"):
            total += _count_ops(library[node.attr["f"].func.name].node_def, library)
    return total


def ops_per_applied_step(models: dict[str, keras.Model]) -> None:
    """Counts the ops ``optimizer.apply`` runs on an applied (finite) step, branches included:
    a machine-independent measure of the wrapper's overhead, unlike the timings above."""
    counts = {}
    for name, model in models.items():
        grads = [tf.zeros_like(v) for v in model.trainable_variables]
        graph = (
            tf.function(lambda g, m=model: m.optimizer.apply(g, m.trainable_variables))
            .get_concrete_function(grads)
            .graph.as_graph_def()
        )
        library = {f.signature.name: f for f in graph.library.function}
        counts[name] = _count_ops(graph.node, library)
    n = len(models["adam"].trainable_variables)
    print(f"ops run by optimizer.apply on an applied step ({n} gradients), beyond plain Adam:")
    for name, count in counts.items():
        print(f"{name:>10}: {count:4d} ops   {count - counts['adam']:+4d}")


if __name__ == "__main__":
    main()
