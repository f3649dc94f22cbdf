"""Where a train step spends its time, per op type and per node, for two variants side by side.

``bench/train_speed.py`` says *whether* a variant is slower than a peer; this says *where*.
Each variant of ``train_speed`` (same models, same set-up) runs in its own process, warms up,
then traces a few steps with TensorFlow's profiler; the trace's executor events (one per node
run: ``"<node>:<op type>"``) are summed per op type and per node. Node names are compared
with the numeric suffixes Keras and tracing add (``dense_4_1``, ``Sub_142``) removed, so the
same layer lines up across variants.

    python bench/step_profile.py --model bert --variants tf_amp,keras_mixed_bfloat16
    python bench/step_profile.py --model resnet50 --ops Cast,AddN --nodes 30

Times are per step and summed over the executor's threads (ops running at the same time each
count their whole duration), so they add up to more than the step; a difference of a few
percent in one op type is within run-to-run noise. This is how the update guard was found: on
the BERT-like step tf_amp ran 291 Casts (63 ms) against Keras's 225 (27 ms), most of them
around an optimizer step painted bfloat16.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter

_SUFFIX = re.compile(r"_\d+(?=/|$)")
# Trace events that are not one node's run: the whole function call and the executor's loop.
_NOT_NODES = frozenset({"Process", "Run"})

_CHILD = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import train_speed
model_name, variant, logdir, steps = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
os.environ.update(train_speed.VARIANTS[variant])
import tensorflow as tf
model, x, y = train_speed.prepare(model_name, variant)
for _ in range(3):
    model.train_on_batch(x, y)
start = time.perf_counter()
for _ in range(steps):
    model.train_on_batch(x, y)
step_s = (time.perf_counter() - start) / steps
tf.profiler.experimental.start(logdir)
for _ in range(steps):
    model.train_on_batch(x, y)
tf.profiler.experimental.stop()
print("STEP", step_s)
"""


def trace_variant(model: str, variant: str, steps: int, logdir: str) -> float:
    """Runs ``variant`` in a subprocess and leaves its trace in ``logdir``; the step time."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, here, model, variant, logdir, str(steps)],
        env=env, capture_output=True, text=True, timeout=1800,
    )
    match = re.search(r"^STEP (\S+)$", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or match is None:
        raise RuntimeError(f"{variant}: {proc.stderr[-2000:]}")
    return float(match.group(1))


def node_times(logdir: str, steps: int) -> tuple[Counter, Counter, Counter]:
    """(ms per step by op type, runs per step by op type, ms per step by (op type, node))."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
    if not paths:
        raise RuntimeError(f"no profiler trace under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as trace:
        space.ParseFromString(trace.read())
    by_op: Counter = Counter()
    runs: Counter = Counter()
    by_node: Counter = Counter()
    for plane in space.planes:
        metadata = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                name = metadata[event.metadata_id].name
                node, _, op = name.rpartition(":")
                if not node or not op or " " in op or op in _NOT_NODES:
                    continue
                ms = event.duration_ps / 1e9 / steps
                by_op[op] += ms
                runs[op] += 1
                by_node[(op, _SUFFIX.sub("", node))] += ms
    for op in runs:
        runs[op] //= steps
    return by_op, runs, by_node


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert")
    parser.add_argument("--variants", default="tf_amp,keras_mixed_bfloat16",
                        help="two variants of bench/train_speed.py")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25, help="op types shown")
    parser.add_argument("--ops", default="Cast", help="op types whose nodes are compared")
    parser.add_argument("--nodes", type=int, default=20, help="nodes shown")
    parser.add_argument("--json", help="also write the tables here")
    args = parser.parse_args()
    variants = args.variants.split(",")
    if len(variants) != 2:
        parser.error("--variants takes exactly two variants")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants:
            logdir = os.path.join(tmp, variant)
            started = time.perf_counter()
            step = trace_variant(args.model, variant, args.steps, logdir)
            results[variant] = (step, *node_times(logdir, args.steps))
            print(f"{variant}: step {step * 1e3:.1f} ms (traced in "
                  f"{time.perf_counter() - started:.0f} s)")
    (step_a, ops_a, runs_a, nodes_a), (step_b, ops_b, runs_b, nodes_b) = (
        results[v] for v in variants)
    a, b = variants
    print(f"\nms per step by op type (summed over threads), largest difference first\n"
          f"{'op':<36} {a:>23} {b:>23}")
    for op in sorted(set(ops_a) | set(ops_b), key=lambda o: -abs(ops_a[o] - ops_b[o]))[:args.top]:
        print(f"{op:<36} {ops_a[op]:>10.2f} ({runs_a[op]:>5} runs) "
              f"{ops_b[op]:>10.2f} ({runs_b[op]:>5} runs)")
    wanted = set(args.ops.split(","))
    keys = {k for k in set(nodes_a) | set(nodes_b) if k[0] in wanted}
    print(f"\nnodes of {sorted(wanted)}, ms per step, largest difference first")
    for key in sorted(keys, key=lambda k: -abs(nodes_a[k] - nodes_b[k]))[:args.nodes]:
        print(f"{nodes_a[key]:>8.2f} {nodes_b[key]:>8.2f}  {key[0]:<12} {key[1]}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({v: {"step_s": r[0], "ms_by_op": r[1], "runs_by_op": r[2]}
                       for v, r in results.items()}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
