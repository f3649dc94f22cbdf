"""Are this machine's reduced-precision kernels faster than float32? The evidence behind ``auto``.

``tf_amp.hardware`` chooses the ``auto`` target from CPU feature flags: bfloat16 where the CPU
has AMX-BF16 or AVX512-BF16 (and oneDNN is on), float32 where it has neither. A flag is a
belief about speed; this bench measures it. It times the allow-list ops that carry a training
step (MatMul, BatchMatMul, Conv2D and its two gradients) alone, at the shapes of the bench
models, in float32, bfloat16 and float16, with ``tf_amp.probe``'s timer (each op rebuilt alone,
fed from variables, the dtypes run in interleaved rounds, net of a session run's own cost), and
prints per op the reduced time over float32's.

It then says whether the ``auto`` choice for this CPU agrees with what was measured: agreeing
means auto picked bfloat16 and bfloat16 is faster on the geometric mean of the ops, or auto kept
float32 and neither 16-bit type is faster. With ``--proof`` it also runs each op once more
under ``ONEDNN_VERBOSE=1`` and prints the oneDNN implementation that ran it per dtype
and the data type it computed in (``brg_matmul:avx512_core_amx ... bf16`` is AMX, ``ref`` is
oneDNN's reference loops; ``gemm_api - f32`` is the float32 GEMM that TensorFlow's Eigen kernels
call, also for 16-bit tensors they convert first; no line at all, an Eigen kernel of its own):
proof of whether the reduced type really ran, and on which instructions.

    python bench/op_speed.py                 # all ops, bfloat16 and float16
    python bench/op_speed.py --dtypes bfloat16 --repeats 9 --proof
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _onednn import executed_primitives  # noqa: E402

# (name, op builder's arguments): the shapes of the bench models' hot ops (bench/train_speed.py).
CASES: dict[str, dict[str, Any]] = {
    "MatMul 1024x1024x1024": {"kind": "matmul", "a": (1024, 1024), "b": (1024, 1024)},
    "MatMul 256x2048x2048 (MLP)": {"kind": "matmul", "a": (256, 2048), "b": (2048, 2048)},
    "BatchMatMul 96x128x64x128 (BERT attention)": {
        "kind": "batch_matmul", "a": (96, 128, 64), "b": (96, 64, 128)},
    "Conv2D 3x3 64->64 32x32 b16 (ResNet)": {"kind": "conv", "x": (16, 32, 32, 64),
                                              "w": (3, 3, 64, 64)},
    "Conv2D 3x3 32->64 16x16 b64 (digits)": {"kind": "conv", "x": (64, 16, 16, 32),
                                              "w": (3, 3, 32, 64)},
}


def case_ops(name: str, p: Any, q: Any) -> Any:
    """The case's ops on two inputs of any float type: a product, or a convolution and both its
    gradients (Conv2DBackpropInput and Conv2DBackpropFilter, fed the output as its gradient)."""
    import tensorflow as tf

    if CASES[name]["kind"] in ("matmul", "batch_matmul"):
        return tf.linalg.matmul(p, q)  # rank 3: BatchMatMulV2
    with tf.GradientTape() as tape:
        tape.watch([p, q])
        y = tf.nn.conv2d(p, q, strides=1, padding="SAME")
    return tape.gradient(y, [p, q], output_gradients=y)


def case_shapes(name: str) -> list[tuple[int, ...]]:
    case = CASES[name]
    return [case[k] for k in (("a", "b") if "a" in case else ("x", "w"))]


def case_graph_def(name: str) -> Any:
    """A float32 GraphDef of the case's ops with every shape recorded, as the probe reads it."""
    import tensorflow as tf

    specs = [tf.TensorSpec(shape, tf.float32) for shape in case_shapes(name)]
    step = tf.function(lambda p, q: case_ops(name, p, q), autograph=False)
    return step.get_concrete_function(*specs).graph.as_graph_def(add_shapes=True)


ALLOW_OPS = ("MatMul", "BatchMatMulV2", "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")


def time_case(name: str, dtypes: list[str], repeats: int) -> dict[str, dict[str, float]]:
    """Per op of the case: float32 seconds, and the ratio of each reduced dtype to it."""
    from tf_amp import probe

    graph_def = case_graph_def(name)
    rows: dict[str, dict[str, float]] = {}
    for dtype in dtypes:
        timings = probe.probe_graph(graph_def, dtype, dict.fromkeys(ALLOW_OPS, "allow"), repeats)
        for timing in timings:
            row = rows.setdefault(timing.signature.op, {"float32_s": timing.float32_s})
            row[dtype] = timing.ratio
    return rows


def agreement(auto_dtype: str, means: dict[str, float]) -> str:
    """Whether the ``auto`` target is what these measurements would choose."""
    faster = {d: m for d, m in means.items() if m < 1.0}
    if auto_dtype == "float32":
        if not faster:
            return "agrees: auto keeps float32 and no 16-bit type is faster here"
        best = min(faster, key=faster.get)
        return (f"DISAGREES: auto keeps float32 but {best} ran these ops at "
                f"{faster[best]:.2f}x float32's time")
    if auto_dtype in faster:
        return f"agrees: auto picks {auto_dtype}, which ran these ops at {means[auto_dtype]:.2f}x"
    if auto_dtype in means:
        return (f"DISAGREES: auto picks {auto_dtype}, which ran these ops at "
                f"{means[auto_dtype]:.2f}x float32's time")
    return f"not measured: auto picks {auto_dtype}, not among --dtypes"


# --------------------------------------------------------------------------- proof


def onednn_implementations(name: str, dtype: str) -> Counter[str]:
    """oneDNN primitives and the implementation that ran them, for one run of the case's ops
    in ``dtype`` (a subprocess with ``ONEDNN_VERBOSE=1``)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import op_speed as o, tensorflow as tf\n"
        "name, dtype = sys.argv[2], tf.as_dtype(sys.argv[3])\n"
        "p, q = (tf.cast(tf.random.normal(s), dtype) for s in o.case_shapes(name))\n"
        "run = tf.function(lambda p, q: o.case_ops(name, p, q))\n"
        "run(p, q); print('=== RUN', flush=True); run(p, q)\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", code, here, name, dtype], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"{name} in {dtype}: {proc.stderr.strip().splitlines()[-1:]}")
    return executed_primitives(proc.stdout.split("=== RUN", 1)[-1], implementation=True)


# --------------------------------------------------------------------------- report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds per op")
    parser.add_argument("--proof", action="store_true", help="oneDNN implementations per dtype")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tf_amp import hardware

    dtypes = [d for d in args.dtypes.split(",") if d]
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    auto = hardware.choose_target("CPU")
    print(json.dumps({"cpu_flags": sorted(set(hardware.FAST_BF16_FLAGS) & hardware.cpu_flags()),
                      "onednn": hardware.onednn_enabled(), "auto_target": auto.__dict__}))
    header = "".join(f"{d + ' / float32':>20}" for d in dtypes)
    print(f"{'case':<44} {'op':<22} {'float32':>10}{header}")
    ratios: dict[str, list[float]] = {d: [] for d in dtypes}
    for name in cases:
        for op, row in time_case(name, dtypes, args.repeats).items():
            cells = "".join(f"{row[d]:>19.2f}x" if d in row else f"{'-':>20}" for d in dtypes)
            print(f"{name:<44} {op:<22} {row['float32_s'] * 1e3:>8.2f}ms{cells}", flush=True)
            for d in dtypes:
                if d in row:
                    ratios[d].append(row[d])
    means = {d: statistics.geometric_mean(r) for d, r in ratios.items() if r}
    print("geometric mean, reduced time / float32 time: "
          + ", ".join(f"{d} {m:.2f}x" for d, m in means.items()))
    print(f"auto target for this CPU ({auto.dtype}): {agreement(auto.dtype, means)}")
    if args.proof:
        for name in cases:
            for dtype in ["float32", *dtypes]:
                shown = ", ".join(f"{k} {v}" for k, v in
                                  sorted(onednn_implementations(name, dtype).items()))
                print(f"oneDNN, {name}, {dtype}: {shown or 'none (an Eigen kernel)'}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
