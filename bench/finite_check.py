"""Benchmark: unscale + all-finite check over real gradient lists, three ways, same run.

For ResNet-50 (shapes of ``keras.applications.ResNet50(weights=None)``'s trainable variables)
and a BERT-base-sized list, in float32 and float16, it times inside ``tf.function``:

  (a) Keras 3 ``LossScaleOptimizer``: per gradient ``all(isfinite(g))``, ``stack``, ``all``,
      then ``g * cast(1/scale)``;
  (b) ``tf.compat.v1`` mixed precision: ``g * cast(1/scale)`` per gradient, then
      ``reduce_all([reduce_all(is_finite(g)) ...])`` on the unscaled gradients;
  (c) tf_amp's fused ``TfAmpUnscaleAndCheckFinite``;

and, as the floor, a C reference over the same bytes (OpenMP over all cores, -O3 -march=native):
a pure memory read, and an in-place scale (read + write: the least any unscale can move).

How: in a train step the gradients are fresh temporaries that nothing else holds, so TF may
write results into their buffers. Each method therefore runs n times in a while loop whose
carried gradients are the previous pass's outputs; the slope between two values of n is the
"in step" time. It includes the loop's own per-tensor cost (Enter/Merge/Switch/NextIteration
for each carried tensor, the same for every method; a pass-through method cannot measure it,
as Grappler hoists unchanged loop variables), so it overstates our distance to the C floor.
Timing on caller-held tensors, where every method must allocate its outputs
(page faults included), is printed too ("held" column). GB/s counts one read and one write of
the list per pass, the least an unscale can move.

Run: ``python bench/finite_check.py`` (``--repeats`` to trade time for precision).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_amp import ops  # noqa: E402

C_REFERENCE = r"""
#include <stddef.h>
#include <stdint.h>
uint32_t read_all(const uint32_t* data, int64_t n) {
  uint32_t bits = 0;  /* an OR reduction vectorises; a strict float sum would not */
  #pragma omp parallel for reduction(|:bits) schedule(static)
  for (int64_t i = 0; i < n; ++i) bits |= data[i];
  return bits;
}
void scale_in_place(float* data, int64_t n, float factor) {
  #pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) data[i] *= factor;
}
"""


def resnet50_shapes() -> list[tuple[int, ...]]:
    import keras

    model = keras.applications.ResNet50(weights=None)
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    del model
    keras.backend.clear_session()
    return shapes


def bert_base_shapes(layers: int = 12, hidden: int = 768, ffn: int = 3072) -> list[tuple]:
    shapes: list[tuple[int, ...]] = [(30522, hidden), (512, hidden), (2, hidden), (hidden,),
                                     (hidden,)]
    for _ in range(layers):
        for _ in range(4):  # query, key, value, attention output
            shapes += [(hidden, hidden), (hidden,)]
        shapes += [(hidden,), (hidden,), (hidden, ffn), (ffn,), (ffn, hidden), (hidden,),
                   (hidden,), (hidden,)]
    shapes += [(hidden, hidden), (hidden,)]  # pooler
    return shapes


def keras_way(grads: list[tf.Tensor], scale: tf.Tensor):
    finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
    inverse = 1.0 / scale
    return [g * tf.cast(inverse, g.dtype) for g in grads], finite


def tf1_way(grads: list[tf.Tensor], scale: tf.Tensor):
    inverse = 1.0 / scale
    unscaled = [g * tf.cast(inverse, g.dtype) for g in grads]
    return unscaled, tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in unscaled])


def tf_amp_way(grads: list[tf.Tensor], scale: tf.Tensor):
    return ops.unscale_and_check_finite(grads, scale, use_native=True)


METHODS: dict[str, Callable] = {
    "(a) keras LossScaleOptimizer": keras_way,
    "(b) tf.compat.v1": tf1_way,
    "(c) tf_amp fused op": tf_amp_way,
}


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # trace / warm up
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def build_c_reference(scratch: str) -> ctypes.CDLL:
    source = os.path.join(scratch, "reference.c")
    library = os.path.join(scratch, "reference.so")
    with open(source, "w") as handle:
        handle.write(C_REFERENCE)
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", source, "-o",
                    library], check=True)
    lib = ctypes.CDLL(library)
    lib.read_all.restype = ctypes.c_uint32
    lib.read_all.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.scale_in_place.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_float]
    return lib


def c_reference_seconds(lib: ctypes.CDLL, total_bytes: int, repeats: int) -> tuple[float, float]:
    buffer = np.ones(total_bytes // 4, dtype=np.float32)  # float view of the same byte count
    pointer, n = buffer.ctypes.data, buffer.size
    read = median_seconds(lambda: lib.read_all(pointer, n), repeats)
    scale = median_seconds(lambda: lib.scale_in_place(pointer, n, ctypes.c_float(1.0)), repeats)
    return read, scale


def per_pass_seconds(method: Callable, make_grads: Callable, scale: tf.Variable,
                     repeats: int, passes: tuple[int, int] = (2, 10)) -> float:
    """Steady-state seconds of one method over the whole list, in place where TF allows.

    The gradients are made once, then a while loop applies the method `n` times, each pass
    taking the previous pass's outputs (fresh, unshared tensors, like a train step's
    gradients). The slope between two pass counts removes the set-up cost.
    """

    @tf.function
    def run(n: tf.Tensor) -> tf.Tensor:
        def body(i, finite, grads):
            unscaled, ok = method(list(grads), scale.read_value())
            return i + 1, tf.logical_and(finite, ok), unscaled

        _, finite, _ = tf.while_loop(lambda i, *_: i < n, body,
                                     (tf.constant(0), tf.constant(True), make_grads()))
        return finite

    low, high = passes
    seconds_low = median_seconds(lambda: run(tf.constant(low)).numpy(), repeats)
    seconds_high = median_seconds(lambda: run(tf.constant(high)).numpy(), repeats)
    return (seconds_high - seconds_low) / (high - low)


def bench_list(name: str, shapes, dtype: tf.DType, lib: ctypes.CDLL, repeats: int) -> dict:
    variables = [tf.Variable(tf.random.normal(s, dtype=tf.float32), dtype=tf.float32)
                 for s in shapes]
    held = [tf.cast(v, dtype) for v in variables]
    total_bytes = sum(int(np.prod(s)) for s in shapes) * dtype.size
    # Scale 1 keeps values unchanged over many passes; it is a variable, so nothing folds it.
    scale = tf.Variable(1.0)

    def make_grads() -> list[tf.Tensor]:
        return [tf.cast(v, dtype) * tf.cast(scale, dtype) for v in variables]

    results = {"name": name, "dtype": dtype.name, "tensors": len(shapes),
               "megabytes": total_bytes / 1e6}
    for label, method in METHODS.items():
        on_held = tf.function(lambda method=method: method(held, scale.read_value()))
        in_step = per_pass_seconds(method, make_grads, scale, repeats)
        results[label] = (in_step,
                          median_seconds(lambda f=on_held: tf.nest.flatten(f())[-1].numpy(),
                                         repeats))
    results["c_read"], results["c_scale"] = c_reference_seconds(lib, total_bytes, repeats)
    return results


def report(r: dict) -> None:
    ours = r["(c) tf_amp fused op"][0]
    print(f"\n{r['name']} {r['dtype']}: {r['tensors']} tensors, {r['megabytes']:.1f} MB")
    print(f"  {'method':32s} {'in step ms':>10s} {'GB/s':>7s} {'held ms':>8s} "
          f"{'vs ours':>8s} {'vs C scale':>10s}")
    gigabytes = r["megabytes"] / 1e3
    for label in METHODS:
        in_step, held = r[label]
        print(f"  {label:32s} {in_step * 1e3:10.2f} {2 * gigabytes / in_step:7.1f} "
              f"{held * 1e3:8.2f} {in_step / ours:7.2f}x {in_step / r['c_scale']:9.2f}x")
    for label, seconds, passes in (("C memory read", r["c_read"], 1),
                                   ("C in-place scale (floor)", r["c_scale"], 2)):
        print(f"  {label:32s} {seconds * 1e3:10.2f} {passes * gigabytes / seconds:7.1f}")
    print(f"  => ours / C scale floor = {ours / r['c_scale']:.2f}x (goal <= 1.3x); "
          f"keras / ours = {r['(a) keras LossScaleOptimizer'][0] / ours:.2f}x (goal >= 2x)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--models", default="resnet50,bert-base")
    parser.add_argument("--dtypes", default="float32,float16")
    args = parser.parse_args(argv)
    if not ops.native_op_available():
        print("native op not built: pip install --no-build-isolation -e .", file=sys.stderr)
        return 1
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs, intra-op threads "
          f"{tf.config.threading.get_intra_op_parallelism_threads() or 'default'}")
    lists = {"resnet50": resnet50_shapes, "bert-base": bert_base_shapes}
    with tempfile.TemporaryDirectory() as scratch:
        lib = build_c_reference(scratch)
        for model in args.models.split(","):
            shapes = lists[model]()
            for dtype_name in args.dtypes.split(","):
                report(bench_list(model, shapes, tf.as_dtype(dtype_name), lib, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
