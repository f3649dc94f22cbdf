"""Training speed: tf_amp against float32 and against every peer, on the hardware at hand.

Per model, each variant trains the same model (same initial weights, same batch) in its own
process, and the processes take turns: in every round each variant runs the same number of
train steps, in a rotated order, while the others wait. A variant's figure is the median over
rounds of its time divided by float32's time in the same round, with a 95% bootstrap interval
(these machines are shared and noisy: only paired figures mean anything). One process can be
steadily a few percent slower than another running the same thing; ``--processes N`` runs the
rounds in N fresh sets of processes and pools the paired ratios, so such a bias averages out.

    python bench/train_speed.py                     # every model, default rounds
    python bench/train_speed.py --models mlp,digits --rounds 7
    python bench/train_speed.py --models bert --variants tf_amp,keras_mixed_bfloat16 \
        --rounds 5 --processes 4 --no-proof     # a peer comparison resolved past the noise
    python bench/train_speed.py --float16           # also time float16 on a CPU (slow!)

Variants: ``float32``; ``tf_amp`` (the default: target ``auto``); ``tf_amp_bf16`` and
``tf_amp_fp16`` (forced targets); ``tf_amp_O2`` (auto target, opt level O2);
``tf_amp_probe`` (auto target, the probe keeps ops measured slower float32);
``tf_amp_bf16_probe`` (bfloat16 forced and the probe on: on a CPU whose bfloat16 kernels are
slow, what the probe saves of a forced target);
``tf_amp_no_pass4`` (auto target without TensorFlow's "infer follows allow" pass);
``tf_amp_guard`` (auto target with the normalization guard on, which a bfloat16 target leaves
off by default: normalizations' cancelling sums in float32, as Keras keeps them);
``tf_amp_no_update_guard`` (auto target with the update guard off, which bfloat16 turns on:
the optimizer's arithmetic painted as TensorFlow's pass paints it); ``tf_amp_table_cast``
(auto target, an embedding's gather painted as TensorFlow paints it: the whole table cast to
the target every step, instead of the rows gathered); Keras's
``mixed_bfloat16`` / ``mixed_float16`` policies; TensorFlow's own Grappler pass
``auto_mixed_precision_onednn_bfloat16``; ``float32_again`` (only when asked for: a second
float32 process, whose ratio to the first shows how far apart two runs of the same thing
land). float16 variants are skipped on a CPU unless asked
for: TensorFlow's CPU float16 kernels run 10x to 130x slower than float32 there (minutes per
step on ResNet-50).

Also printed per model:
- the Amdahl limit: if the allow-list ops are a fraction f of the float32 step (their kernels'
  time in a profiler trace of the step, over all kernels' time) and run s times faster in
  bfloat16 (each timed alone at its shapes by ``tf_amp.probe``), no rewrite of them can beat a
  ratio of (1 - f) + f / s;
- proof that reduced precision ran: oneDNN's primitives per data type in one step of each
  variant, from ``ONEDNN_VERBOSE=1`` (a separate short run, so the log does not slow the timed
  ones);
- the loss after the same number of steps on the same batch, against float32's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _onednn import executed_primitives  # noqa: E402
from _stats import median_ci, verdict  # noqa: E402
from _trace import node_times, op_time_share, trace_variant  # noqa: E402

MODELS: dict[str, dict[str, Any]] = {
    # name: batch, steps per round
    "digits": {"batch": 64, "steps": 10},
    "mlp": {"batch": 256, "steps": 8},
    "resnet50": {"batch": 16, "steps": 2},
    "bert": {"batch": 8, "steps": 2},
}
VARIANTS: dict[str, dict[str, str]] = {
    "float32": {},
    "tf_amp": {},
    "tf_amp_bf16": {"TF_AMP_TARGET_DTYPE": "bfloat16"},
    "tf_amp_fp16": {"TF_AMP_TARGET_DTYPE": "float16"},
    "tf_amp_O2": {"TF_AMP_OPT_LEVEL": "O2"},
    "tf_amp_probe": {"TF_AMP_PROBE": "1"},
    "tf_amp_bf16_probe": {"TF_AMP_TARGET_DTYPE": "bfloat16", "TF_AMP_PROBE": "1"},
    "tf_amp_no_pass4": {"TF_AMP_INFER_FOLLOWS_ALLOW": "0"},
    "tf_amp_guard": {"TF_AMP_GUARD_NORMALIZATION": "1"},
    "tf_amp_no_update_guard": {"TF_AMP_GUARD_UPDATES": "0"},
    "tf_amp_table_cast": {"TF_AMP_SELECT_BEFORE_CAST": "0"},
    # Exp as an infer op, as Keras's bfloat16 GELU gradient runs it: TensorFlow's lists deny it
    # (float16's range), which puts the GELU gradient in float32 between Casts.
    "tf_amp_bf16_exp": {"TF_AMP_TARGET_DTYPE": "bfloat16", "TF_AMP_DENYLIST_REMOVE": "Exp",
                        "TF_AMP_INFERLIST_ADD": "Exp"},
    "keras_mixed_bfloat16": {},
    "keras_mixed_float16": {},
    "tf_onednn_bf16_pass": {},
    "float32_again": {},  # a second float32 process: the noise floor of a ratio (A/A)
}
NOT_BY_DEFAULT = ("float32_again", "tf_amp_table_cast", "tf_amp_bf16_exp")  # ask for them by name
FLOAT16_VARIANTS = ("tf_amp_fp16", "keras_mixed_float16")
# Small enough that no model fits its one batch within a bench run: the final losses compare.
LEARNING_RATE = 1e-5


# --------------------------------------------------------------------------- the models


def build_model(name: str) -> tuple[Any, Any, Any]:
    """(model, x, y): seeded, so every variant starts from the same weights and batch."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    batch = MODELS[name]["batch"]
    if name == "digits":
        inputs = keras.Input((32, 32, 1))
        h = inputs
        for filters in (32, 32, "pool", 64, 64, "pool"):
            h = (keras.layers.MaxPooling2D()(h) if filters == "pool" else
                 keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(h))
        h = keras.layers.Dense(256, activation="relu")(keras.layers.Flatten()(h))
        outputs = keras.layers.Dense(10)(h)
        x = rng.random((batch, 32, 32, 1), np.float32)
    elif name == "mlp":
        inputs = keras.Input((2048,))
        h = inputs
        for _ in range(4):
            h = keras.layers.Dense(2048, activation="relu")(h)
        outputs = keras.layers.Dense(10)(h)
        x = rng.standard_normal((batch, 2048), np.float32)
    elif name == "resnet50":
        net = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10,
                                          classifier_activation=None)
        inputs, outputs = net.input, net.output
        x = rng.random((batch, 64, 64, 3), np.float32)
    elif name == "bert":
        inputs, outputs = _bert_like(seq=128, d_model=768, heads=12, layers=4, vocab=8000)
        x = rng.integers(0, 8000, (batch, 128), np.int32)
    else:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(MODELS)}")
    outputs = keras.layers.Activation("linear", dtype="float32")(outputs)  # float32 logits
    y = rng.integers(0, 10 if name != "bert" else 2, (batch,), np.int32)
    return keras.Model(inputs, outputs), x, y


def _bert_like(seq: int, d_model: int, heads: int, layers: int, vocab: int) -> tuple[Any, Any]:
    """A BERT-base-like encoder: embeddings, post-LayerNorm blocks, GELU FFN, a classifier."""
    import keras

    tokens = keras.Input((seq,), dtype="int32")
    h = keras.layers.Embedding(vocab, d_model)(tokens)
    for _ in range(layers):
        attention = keras.layers.MultiHeadAttention(heads, d_model // heads)(h, h)
        h = keras.layers.LayerNormalization()(h + attention)
        ffn = keras.layers.Dense(4 * d_model, activation="gelu")(h)
        h = keras.layers.LayerNormalization()(h + keras.layers.Dense(d_model)(ffn))
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    return tokens, keras.layers.Dense(2)(pooled)


def prepare(model_name: str, variant: str) -> tuple[Any, Any, Any]:
    """Builds and compiles the model the way ``variant`` trains it."""
    import keras
    import tensorflow as tf

    if variant.startswith("keras_mixed_"):
        keras.mixed_precision.set_global_policy(variant.removeprefix("keras_"))
    if variant == "tf_onednn_bf16_pass":
        tf.config.optimizer.set_experimental_options(
            {"auto_mixed_precision_onednn_bfloat16": True}
        )
    model, x, y = build_model(model_name)
    optimizer: Any = keras.optimizers.Adam(LEARNING_RATE)
    if variant.startswith("tf_amp"):
        import tf_amp

        optimizer = tf_amp.enable_mixed_precision_graph_rewrite(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    return model, x, y


# --------------------------------------------------------------------------- workers


def _worker(model_name: str, variant: str, env: dict[str, str], conn: Any) -> None:
    """Builds the variant, warms it up, then runs ``steps`` train steps per request."""
    os.environ.update(env)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        model, x, y = prepare(model_name, variant)
        for _ in range(2):
            loss = model.train_on_batch(x, y)
        conn.send(("ready", None))
        while True:
            message = conn.recv()
            if message is None:
                break
            start = time.perf_counter()
            for _ in range(message):
                loss = model.train_on_batch(x, y)
            conn.send((time.perf_counter() - start, float(loss)))
    except Exception as error:  # reported to the coordinator, which names the variant
        conn.send(("error", f"{type(error).__name__}: {error}"))


def _process_set(model_name: str, variants: list[str], rounds: int, first: int) -> dict[str, Any]:
    """One process per variant, ``rounds`` interleaved rounds; step times and final losses.

    ``first`` rotates the order in which the processes start and take turns, so that across
    process sets no variant is always first (or always built into a fresh machine's memory).
    """
    ctx = mp.get_context("spawn")
    order = variants[first % len(variants):] + variants[: first % len(variants)]
    workers = {}
    for variant in order:
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_worker, args=(model_name, variant, VARIANTS[variant],
                                                    child), daemon=True)
        process.start()
        workers[variant] = (process, parent)
    failed = {}
    for variant, (_, conn) in list(workers.items()):
        status, detail = conn.recv()
        if status == "error":
            failed[variant] = detail
            workers.pop(variant)[0].join()
    steps = MODELS[model_name]["steps"]
    times: dict[str, list[float]] = {v: [] for v in workers}
    losses: dict[str, float] = {}
    order = list(workers)
    for r in range(rounds):
        rotated = order[r % len(order):] + order[: r % len(order)]
        for variant in rotated:
            conn = workers[variant][1]
            conn.send(steps)
            seconds, loss = conn.recv()
            if seconds == "error":
                raise RuntimeError(f"{variant}: {loss}")
            times[variant].append(seconds / steps)
            losses[variant] = loss
    for process, conn in workers.values():
        conn.send(None)
        process.join(timeout=30)
    return {"times": times, "losses": losses, "failed": failed}


def time_variants(model_name: str, variants: list[str], rounds: int,
                  processes: int = 1) -> dict[str, Any]:
    """Paired, interleaved rounds; returns per variant the ratios to float32 and final loss.

    Why ``processes``: on a shared virtual machine one process of a variant can run steadily a
    few percent slower than another process of the same variant (memory placement,
    neighbours), a bias that more rounds in the same processes do not average out. Each of
    ``processes`` fresh sets of processes runs ``rounds`` rounds; the ratios, paired within a
    round, are pooled.
    """
    times: dict[str, list[float]] = {}
    losses: dict[str, float] = {}
    failed: dict[str, str] = {}
    for index in range(processes):
        one = _process_set(model_name, [v for v in variants if v not in failed], rounds, index)
        failed.update(one["failed"])
        losses.update(one["losses"])
        for variant, values in one["times"].items():
            times.setdefault(variant, []).extend(values)
    times = {v: t for v, t in times.items() if v not in failed}
    base = times.get("float32")
    result: dict[str, Any] = {"failed": failed, "variants": {}}
    for variant, values in times.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)] if base else []
        result["variants"][variant] = {
            "times": values,
            "step_s": sorted(values)[len(values) // 2],
            "ratio": median_ci(ratios) if ratios else None,
            "loss": losses[variant],
        }
    return result


# --------------------------------------------------------------------------- proof and limit


def onednn_proof(model_name: str, variant: str) -> dict[str, int]:
    """oneDNN primitives of one train step, counted by kind and data type (ONEDNN_VERBOSE)."""
    env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="2", **VARIANTS[variant])
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import train_speed as t; "
        "m, x, y = t.prepare(sys.argv[2], sys.argv[3]); m.train_on_batch(x, y); "
        "print('=== STEP', flush=True); m.train_on_batch(x, y)"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", code, here, model_name, variant], env=env,
                          capture_output=True, text=True, timeout=1800)
    return dict(executed_primitives(proc.stdout.split("=== STEP", 1)[-1]))


def amdahl_limit(model_name: str) -> dict[str, float] | None:
    """The best ratio to float32 a rewrite of the allow-list ops alone could reach.

    Their share f of the float32 step comes from a profiler trace of that step (their kernels'
    time over all kernels' time, both summed over threads: comparing alone-times with the
    step's wall time overcounts on a machine where the step runs ops side by side); their
    speed-up s, from timing each one alone at its shapes in float32 and in bfloat16
    (``tf_amp.probe``). The limit is (1 - f) + f / s.
    """
    import keras
    import tensorflow as tf

    from tf_amp import probe
    from tf_amp.lists import OpLists

    model, x, y = build_model(model_name)
    optimizer = keras.optimizers.Adam(LEARNING_RATE)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(autograph=False)  # no Python control flow to convert
    def step(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    graph_def = step.get_concrete_function(x, y).graph.as_graph_def(add_shapes=True)
    lists = OpLists.default("bfloat16")
    allow = {n.op: "allow" for n in graph_def.node if lists.category(n.op) == "allow"}
    timings = probe.probe_graph(graph_def, "bfloat16", allow, repeats=3)
    f32 = sum(t.float32_s * len(t.nodes) for t in timings)
    bf16 = sum(t.reduced_s * len(t.nodes) for t in timings)
    with tempfile.TemporaryDirectory() as logdir:
        steps = 3
        trace_variant(model_name, "float32", steps, logdir)
        allow_ms, total_ms = op_time_share(node_times(logdir, steps)[0], lists.category)
    if not f32 or not total_ms:
        return None
    fraction = allow_ms / total_ms
    return {"fraction": fraction, "speedup": f32 / bf16,
            "limit": (1 - fraction) + fraction * bf16 / f32}


# --------------------------------------------------------------------------- report


def run_model(model_name: str, variants: list[str], rounds: int, processes: int,
              proof: bool) -> None:
    from tf_amp import hardware

    print(f"\n=== {model_name} (batch {MODELS[model_name]['batch']}, "
          f"{MODELS[model_name]['steps']} steps per round, {rounds} rounds x {processes} "
          "process sets)", flush=True)
    result = time_variants(model_name, variants, rounds, processes)
    rows = result["variants"]
    base = rows["float32"]
    limit = amdahl_limit(model_name) if "float32" in rows else None
    if limit:
        speed = (f"{limit['speedup']:.2f}x faster" if limit["speedup"] >= 1
                 else f"{1 / limit['speedup']:.2f}x slower")
        print(f"Amdahl limit: allow-list ops are {limit['fraction']:.0%} of the float32 step's "
              f"kernel time (profiler trace) and {speed} in bfloat16 alone: ratio >= "
              f"{limit['limit']:.2f} if only they changed (elementwise ops moving half the "
              "bytes can take a variant past it)")
    print(f"{'variant':<24} {'step':>9} {'ratio to float32 [95% CI]':>28} {'of limit':>9} "
          f"{'loss':>9} {'- fp32':>8}")
    for variant, row in rows.items():
        ratio = row["ratio"]
        text = f"{ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}]" if ratio else "-"
        gained = "-"
        if limit and ratio and limit["limit"] < 1:
            gained = f"{(1 - ratio[0]) / (1 - limit['limit']):.0%}"
        delta = row["loss"] - base["loss"]
        print(f"{variant:<24} {row['step_s'] * 1e3:>7.1f}ms {text:>28} {gained:>9} "
              f"{row['loss']:>9.4f} {delta:>+8.4f}")
    if "tf_amp" in rows and "float32" in rows:
        low, high = rows["tf_amp"]["ratio"][1:]
        if hardware.choose_target("CPU").rewrites:
            print(f"tf_amp default never slower than float32 (ratio <= 1): "
                  f"{verdict(low, high, 1.0)}")
        else:  # auto keeps float32: the default may cost the wrapper, not more (issue's goal)
            print(f"tf_amp default (float32 here: no fast reduced precision) costs at most 10% "
                  f"over float32 (ratio <= 1.10): {verdict(low, high, 1.10)}")
        ours = rows["tf_amp"]["times"]
        for peer in (v for v in rows if not v.startswith(("float32", "tf_amp"))):
            paired = [a / b for a, b in zip(ours, rows[peer]["times"], strict=True)]
            mid, low, high = median_ci(paired)
            print(f"tf_amp default / {peer} (paired per round; goal <= 1): {mid:.2f} "
                  f"[{low:.2f}, {high:.2f}] {verdict(low, high, 1.0)}")
    for variant, detail in result["failed"].items():
        print(f"{variant}: FAILED: {detail}")
    if proof:
        for variant in rows:
            counts = onednn_proof(model_name, variant)
            shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            print(f"oneDNN primitives, one step, {variant}: {shown or 'none'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants",
                        default=",".join(v for v in VARIANTS if v not in NOT_BY_DEFAULT))
    parser.add_argument("--rounds", type=int, default=5, help="rounds per process set")
    parser.add_argument("--processes", type=int, default=1,
                        help="fresh sets of processes, their paired ratios pooled")
    parser.add_argument("--float16", action="store_true", help="time float16 on a CPU too")
    parser.add_argument("--no-proof", action="store_true", help="skip the ONEDNN_VERBOSE runs")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tf_amp import hardware

    print(json.dumps({"cpu_flags": sorted(set(hardware.FAST_BF16_FLAGS) & hardware.cpu_flags()),
                      "auto_target": hardware.choose_target("CPU").__dict__}))
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    if not args.float16:
        for variant in FLOAT16_VARIANTS:
            if variant in variants:
                variants.remove(variant)
                print(f"{variant}: skipped: TensorFlow's CPU float16 kernels run 10x to 130x "
                      "slower than float32 (--float16 to time them anyway)")
    for name in args.models.split(","):
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; choose from {sorted(MODELS)}")
        run_model(name, ["float32"] + [v for v in variants if v != "float32"], args.rounds,
                  args.processes, not args.no_proof)
    return 0


if __name__ == "__main__":
    sys.exit(main())
