"""Tracing one train step of a ``bench/train_speed.py`` variant with TensorFlow's profiler.

Shared by ``bench/step_profile.py`` (where a step spends its time, two variants side by side)
and ``bench/train_speed.py`` (the allow-list ops' share of the float32 step, for the Amdahl
limit). The trace's executor events, one per node run (``"<node>:<op type>"``), are summed per
op type and per node; durations are summed over the executor's threads, so ops running at the
same time each count their whole duration.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable

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


# Prefixes TensorFlow's graph rewrites put on the op a kernel runs: oneDNN's layout rewrite
# (``_MklMatMul``, ``_MklNativeFusedConv2D``) and the remapper's fusions (``_FusedMatMul``).
_KERNEL_PREFIXES = ("_MklNative", "_Mkl", "_")


def traced_base_ops(op: str) -> list[str]:
    """The op types a traced kernel name may stand for, most specific first.

    ``_MklNativeConv2DBackpropFilterWithBias`` -> ``Conv2DBackpropFilterWithBias``,
    ``Conv2DBackpropFilter``; ``_MklNativeFusedConv2D`` -> ``FusedConv2D``, ``Conv2D``. A fused
    kernel counts as its main op: the bias or activation it absorbed is a small part of it.
    """
    for prefix in _KERNEL_PREFIXES:
        if op.startswith(prefix):
            op = op[len(prefix):]
            break
    names = [op]
    if op.startswith("Fused"):
        names.append(op.removeprefix("Fused"))
    if op.endswith("WithBias"):
        names.append(op.removesuffix("WithBias"))
    return names


def op_time_share(ms_by_op: Counter, category: Callable[[str], str | None],
                  wanted: str = "allow") -> tuple[float, float]:
    """(ms of the ops whose category is ``wanted``, ms of all ops) in a traced step.

    ``category`` maps an op type to its list (``OpLists.category``); each traced kernel is
    looked up under the names ``traced_base_ops`` gives it.
    """
    share = 0.0
    for op, ms in ms_by_op.items():
        if any(category(name) == wanted for name in traced_base_ops(op)):
            share += ms
    return share, sum(ms_by_op.values())
