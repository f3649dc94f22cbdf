"""Train-step overhead of loss scaling: plain Adam vs tf_amp's wrapper vs Keras's wrapper.

Each model is trained by Keras's own train function (``steps_per_execution`` steps per call,
as ``fit`` runs it) with the three optimizers side by side in one process. Rounds are
interleaved and the order rotates every round (A B C, B C A, C A B, ...), so drift and order
effects hit all three alike; each round gives *paired* ratios (tf_amp / adam, keras_lso / adam,
tf_amp / keras_lso) from three timings taken moments apart.

Why several processes: on a shared virtual machine the step time of one model differs from
process to process by more than the effect measured here (memory placement, neighbours), so
``--processes`` fresh processes each run every round schedule, and the ratios are pooled.
Each process builds the three models in a different (rotated) order: with fixed seeds and a
fixed order every process would place them in memory alike and repeat the same bias. The
report gives the median paired ratio with a 95% bootstrap confidence interval, and says "not
resolved" when the interval contains the goal's threshold: a difference smaller than the noise
is reported as such, not as a win or a loss.

Goal (CNN): tf_amp adds <= 2% over plain Adam and is faster than
keras.optimizers.LossScaleOptimizer. Two CNNs: a small one (4 layers, 8 gradients) and a CIFAR-
style ResNet-20 with BatchNorm (65 gradients), where Keras's per-gradient ops add up (+272 ops
on an applied step against tf_amp's +21). The deep MLP (61 layers, 122 small gradients, little
compute) is the case where a wrapper's per-tensor cost shows most. There both wrappers pay
mostly for skipping itself: on CPU, running the 122 variable updates inside one ``tf.cond``
cost +47% to +81% of plain Adam's step in an ablation (plain Adam wrapped in a cond on an all-
finite flag, no loss scaling; +30% to +63% with Grappler off, and +30% to +64% with the If kept
as a function call instead of lowered to Switch/Merge), against +8% to +24% for the fused check
alone. The cond costs parallelism more than work: with one inter-op thread tf_amp adds +9% to
+15% there, with two +51% to +57% (both measured with its If lowered), because plain Adam's
3,500 small update ops overlap the backward pass on the second core and the updates gated by
one cond did not. Any wrapper that leaves weights and slots untouched on a skipped step pays
that cond.

In a CPU-only process tf_amp keeps its cond as one function call (an If not lowered to a
Switch per captured input, 268 on the ResNet-20). On the ResNet-20 at batch 8,
``optimizer.apply`` alone then cost +22 us over Adam against Keras's +147 us with one thread
(+207 us for tf_amp while its If was lowered), and +89 us against +298 us with two. On the
MLP it adds +44% [+34%, +59%] to the step and Keras's wrapper +75% [+57%, +94%].

    python bench/step_overhead.py [--processes 3] [--rounds 20] [--steps 10] [--batch 64]
                                  [--threads 1] [--models cnn,resnet,mlp]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_amp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import median_ci, verdict  # noqa: E402

NAMES = ("adam", "tf_amp", "keras_lso")
PAIRS = (("tf_amp", "adam"), ("keras_lso", "adam"), ("tf_amp", "keras_lso"))


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


def resnet() -> keras.Model:
    """A CIFAR-style ResNet-20 (He et al. 2016, section 4.2): 3 stages x 3 residual blocks of
    conv-BatchNorm-ReLU, 16/32/64 filters, projection shortcuts where the shape changes. 65
    gradient tensors, the shape of CNN people actually train, where a wrapper's per-gradient
    cost counts, unlike the 8 tensors of ``cnn``."""
    keras.utils.set_random_seed(0)
    layers = keras.layers

    def conv_bn(x: Any, filters: int, stride: int = 1, relu: bool = True) -> Any:
        x = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        return layers.ReLU()(x) if relu else x

    inputs = keras.Input((32, 32, 3))
    x = conv_bn(inputs, 16)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage and not block else 1
            shortcut = x
            if stride != 1:
                shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(x)
                shortcut = layers.BatchNormalization()(shortcut)
            y = conv_bn(conv_bn(x, filters, stride), filters, relu=False)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x))


def deep_mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(32, activation="relu") for _ in range(60)]
    return keras.Sequential([keras.Input((32,)), *layers, keras.layers.Dense(10)])


class BenchModel(NamedTuple):
    label: str
    build: Callable[[], keras.Model]
    images: bool  # 32x32x3 images with 10 classes, else 32 features regressed onto 10
    goal: bool  # a CNN: the goal's verdicts are printed for it
    applies: int  # optimizer.apply calls per graph loop in optimizer_step_only
    apply_rounds: int


MODELS = {
    "cnn": BenchModel("small CNN, 4 layers, 8 gradients", cnn, True, True, 100, 10),
    "resnet": BenchModel("ResNet-20 CNN, BatchNorm, 65 gradients", resnet, True, True, 20, 5),
    "mlp": BenchModel("deep MLP, 61 layers, 122 gradients", deep_mlp, False, False, 20, 5),
}


def optimizers() -> dict[str, keras.optimizers.Optimizer]:
    return {
        "adam": keras.optimizers.Adam(1e-3),
        "tf_amp": tf_amp.LossScaleOptimizer(keras.optimizers.Adam(1e-3)),
        "keras_lso": keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3)),
    }


def train_rounds(
    build: Any, x: np.ndarray, y: np.ndarray, loss: Any, args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, keras.Model]]:
    """Seconds per train step of each optimizer, one entry per round, rounds rotated."""
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).cache().repeat()
    models, iterators = {}, {}
    # Build order rotates with the process number: the first model built gets different
    # memory than the last, and the processes should not all favour the same optimizer.
    built = list(optimizers().items())
    shift = args.process % len(built)
    for name, optimizer in built[shift:] + built[:shift]:
        model = build()
        model.compile(optimizer=optimizer, loss=loss, steps_per_execution=args.steps)
        model.make_train_function()
        iterators[name] = iter(data)
        model.train_function(iterators[name])  # trace + warm up
        models[name] = model
    times: dict[str, list[float]] = {name: [] for name in NAMES}
    for r in range(args.rounds):
        # Calling the train function directly (what fit() does per execution) keeps fit's
        # Python bookkeeping out of the numbers.
        for name in NAMES[r % 3 :] + NAMES[: r % 3]:
            start = time.perf_counter()
            float(models[name].train_function(iterators[name])["loss"])
            times[name].append((time.perf_counter() - start) / args.steps)
    return times, models


def worker(args: argparse.Namespace) -> None:
    """One process's measurements, printed as one JSON line for the parent to pool."""
    if args.threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    x = rng.normal(size=(n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=(n,))
    x_deep = rng.normal(size=(n, 32)).astype("float32")
    y_deep = rng.normal(size=(n, 10)).astype("float32")
    sparse_ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    result: dict[str, Any] = {"native_op": tf_amp.native_op_available()}
    for key in args.models.split(","):
        spec = MODELS[key]
        data_x, data_y = (x, y) if spec.images else (x_deep, y_deep)
        loss = sparse_ce if spec.images else keras.losses.MeanSquaredError()
        times, models = train_rounds(spec.build, data_x, data_y, loss, args)
        result[key] = times
        result[key + "_apply_us"] = optimizer_step_only(
            models, data_x[: args.batch], data_y[: args.batch], spec.apply_rounds, spec.applies
        )
        if args.count_ops:
            result[key + "_ops"] = ops_per_applied_step(models)
    print("RESULT " + json.dumps(result), flush=True)


def paired_ratios(times: dict[str, list[float]], a: str, b: str) -> list[float]:
    return [ta / tb for ta, tb in zip(times[a], times[b], strict=True)]


def report_model(label: str, runs: list[dict[str, list[float]]]) -> dict[str, tuple]:
    """Prints pooled step times and paired ratios of one model; returns the ratio stats."""
    pooled = {name: [t for run in runs for t in run[name]] for name in NAMES}
    print(f"\n{label}: {len(pooled['adam'])} rounds per optimizer ({len(runs)} processes)")
    for name in NAMES:
        print(
            f"{name:>10}: median {statistics.median(pooled[name]) * 1e3:7.2f} ms/step"
            f"   best {min(pooled[name]) * 1e3:7.2f} ms/step"
        )
    stats = {}
    for a, b in PAIRS:
        ratios = [r for run in runs for r in paired_ratios(run, a, b)]
        stats[(a, b)] = median, low, high = median_ci(ratios)
        per_process = "  ".join(
            f"{statistics.median(paired_ratios(run, a, b)):.3f}" for run in runs
        )
        print(
            f"  {a} / {b}: median {median:.4f}  95% CI [{low:.4f}, {high:.4f}]"
            f"   per process: {per_process}"
        )
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="train steps per timed round")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per process")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--processes", type=int, default=3, help="fresh processes to pool")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TensorFlow inter- and intra-op threads (0: TensorFlow's default, all cores); "
        "1 takes thread scheduling out of the comparison",
    )
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count-ops", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = set(models) - MODELS.keys()
    if unknown:
        known = ", ".join(MODELS)
        parser.error(f"--models: unknown {', '.join(sorted(unknown))}; pick from {known}")
    if args.worker:
        worker(args)
        return

    results = []
    for p in range(args.processes):
        command = [sys.executable, os.path.abspath(__file__), "--worker"]
        command += ["--steps", str(args.steps), "--rounds", str(args.rounds)]
        command += ["--batch", str(args.batch), "--threads", str(args.threads)]
        command += ["--process", str(p), "--models", args.models]
        command += ["--count-ops"] if p == 0 else []
        out = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit(f"benchmark worker {p} failed (exit {out.returncode})")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
        print(f"process {p + 1}/{args.processes} done", flush=True)

    print(
        f"\nnative op available: {results[0]['native_op']} "
        "(False: tf_amp uses its pure-TF fallback)"
    )
    print(
        f"batch {args.batch}, {args.rounds} rounds x {args.steps} steps per process, "
        f"{os.cpu_count()} CPUs, TensorFlow threads {args.threads or 'default'}, load average "
        f"{os.getloadavg()[0]:.1f}; ratios are paired per round, pooled over processes"
    )
    for key in models:
        stats = report_model(MODELS[key].label, [r[key] for r in results])
        if not MODELS[key].goal:
            continue
        median, low, high = stats[("tf_amp", "adam")]
        print(
            f"goal 1, tf_amp adds <= 2% over Adam ({key}): {100 * (median - 1):+.2f}% "
            f"[{100 * (low - 1):+.2f}%, {100 * (high - 1):+.2f}%] -> {verdict(low, high, 1.02)}"
        )
        median, low, high = stats[("tf_amp", "keras_lso")]
        print(
            f"goal 2, tf_amp faster than keras_lso ({key}): ratio {median:.4f} [{low:.4f}, "
            f"{high:.4f}] -> {verdict(low, high, 1.0)}"
        )
    for key in models:
        best = {n: min(r[key + "_apply_us"][n] for r in results) for n in NAMES}
        print(f"\noptimizer.apply alone ({MODELS[key].label}; best of all rounds):")
        for name in NAMES:
            extra = best[name] - best["adam"]
            print(f"{name:>10}: {best[name]:8.1f} us/apply   {extra:+7.1f} us vs adam")
    for key in models:
        counts = results[0][key + "_ops"]
        label = MODELS[key].label
        print(f"\nops run by optimizer.apply on an applied step ({label}), beyond Adam:")
        for name in NAMES:
            print(f"{name:>10}: {counts[name]:4d} ops   {counts[name] - counts['adam']:+4d}")


def optimizer_step_only(
    models: dict[str, keras.Model], x: np.ndarray, y: np.ndarray, rounds: int, calls: int = 100
) -> dict[str, float]:
    """Microseconds per ``optimizer.apply`` alone, ``calls`` applies in one graph loop, best
    round: the in-graph overhead, free of the forward/backward pass that dominates (and
    blurs) the full-step ratio and of the per-call function overhead. The gradients are held
    by the caller, so unlike in a train step no op can reuse their buffers."""
    steps = {}
    for name, model in models.items():
        with tf.GradientTape() as tape:
            loss = model.loss(y, model(x, training=True))
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
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best


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


def ops_per_applied_step(models: dict[str, keras.Model]) -> dict[str, int]:
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
    return counts


if __name__ == "__main__":
    main()
