"""Peak memory of a train step: plain Adam vs tf_amp's wrapper vs Keras's wrapper.

Each variant runs in a fresh process with TensorFlow's BFC allocator on the CPU
(``TF_CPU_ALLOCATOR_USE_BFC=true``), so ``tf.config.experimental.get_memory_info`` reports the
allocator's own peak: the bytes TensorFlow held, free of the process RSS's allocator noise (the
RSS peak of the same runs moved by 50-100 MB from one process to the next). The model is a
float32 MLP of 6 x Dense(width) (25M parameters at 2048), trained by a ``tf.function`` step;
the figure is the peak during ``--steps`` steps, after two warm-up steps, minus what was held
before them (weights, slots, the batch): what a step adds.

Why the wrappers add memory at all: an apply that may be skipped must see every gradient before
it updates anything, so all gradients are alive at once, where plain Adam updates each variable
as soon as its gradient is ready. What else a wrapper adds depends on the order in which
TensorFlow's executor runs the inner optimizer's per-variable updates once the finite flag lets
them go: run side by side, several variables' Adam temporaries (each as large as the variable)
are alive together. Keras's wrapper multiplies each gradient by 1/scale inside its apply branch;
that multiply happens to stagger the updates. tf_amp's fused op unscales before the branch, in
one pass, and its updates start together; putting a multiply back (measured: the same step
with ``g * 1.0`` from a variable after the fused op) gives Keras's peak, for a second pass over
every gradient. The order, and so every variant's peak (plain Adam's most: how far its updates
overlap the backward pass), also moves with the machine's load: run it on a quiet machine,
with ``--repeats``, and compare variants of one run only.

    python bench/optimizer_memory.py [--width 2048] [--batch 256] [--steps 4] [--inter-op N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

VARIANTS = ("plain", "keras", "tf_amp")

CHILD = r"""
import json, sys
variant, width, batch, steps, inter_op = sys.argv[1], *map(int, sys.argv[2:6])
import tensorflow as tf
if inter_op:
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
import keras
import tf_amp

keras.utils.set_random_seed(0)
inputs = keras.Input((width,))
x = inputs
for _ in range(6):
    x = keras.layers.Dense(width, activation="relu")(x)
model = keras.Model(inputs, keras.layers.Dense(10)(x))
optimizer = keras.optimizers.Adam(1e-4)
if variant == "keras":
    optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
elif variant == "tf_amp":
    optimizer = tf_amp.LossScaleOptimizer(optimizer)
features = tf.random.normal((batch, width))
labels = tf.random.uniform((batch,), 0, 10, tf.int32)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
variables = model.trainable_variables


@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(features, training=True))
        if variant != "plain":
            loss = optimizer.scale_loss(loss)
    optimizer.apply(tape.gradient(loss, variables), variables)


optimizer.build(variables)
step()
step()
tf.config.experimental.reset_memory_stats("CPU:0")
held = tf.config.experimental.get_memory_info("CPU:0")["current"]
for _ in range(steps):
    step()
peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
params = sum(int(v.numpy().size) for v in variables)
mib = 2.0**20
print(json.dumps({"held_mb": held / mib, "peak_mb": peak / mib, "added_mb": (peak - held) / mib,
                  "params": params}))
"""


def measure(variant: str, args: argparse.Namespace) -> dict[str, float]:
    """One variant in a fresh process: the allocator's peak added by the steps, in MiB."""
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_ENABLE_AUTO_MIXED_PRECISION", None)  # the wrappers alone, no rewrite
    argv = [variant, args.width, args.batch, args.steps, args.inter_op]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, argv)],
        env=env, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per variant")
    parser.add_argument("--inter-op", type=int, default=0, help="0: TensorFlow's default")
    args = parser.parse_args()
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    params = 0
    for _ in range(args.repeats):
        for variant in VARIANTS:  # interleaved: a drifting machine hits all variants alike
            figures = measure(variant, args)
            results[variant].append(figures["added_mb"])
            params = int(figures["params"])
    gradients_mb = params * 4 / 2**20
    print(f"MLP 6 x Dense({args.width}), {params / 1e6:.1f}M parameters "
          f"({gradients_mb:.0f} MiB of float32 gradients), batch {args.batch}, "
          f"inter-op threads {args.inter_op or 'default'}; peak added by {args.steps} steps:")
    plain = min(results["plain"])
    for variant in VARIANTS:
        runs = results[variant]
        print(f"  {variant:<8} {min(runs):8.1f} - {max(runs):8.1f} MiB   "
              f"over plain Adam: {min(runs) - plain:+7.1f} MiB "
              f"({(min(runs) - plain) / gradients_mb:+.2f}x the gradients)")


if __name__ == "__main__":
    main()
