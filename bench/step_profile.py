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
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _trace import node_times, trace_variant  # noqa: E402


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
