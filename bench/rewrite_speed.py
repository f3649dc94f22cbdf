"""Benchmark: tf_amp's rewrite vs TensorFlow's auto_mixed_precision pass, same GraphDef, same
process.

    python bench/rewrite_speed.py                 # real graphs + 1k, 10k, 100k, 1M nodes
    python bench/rewrite_speed.py --max-nodes 100000 --repeat 5 --skip-real
    python bench/rewrite_speed.py --growth-rounds 9   # growth: ours warm and cold, TF's warm
    python bench/rewrite_speed.py --work-per-node     # ours only: bytecodes and C calls per node

TensorFlow's side is ``tf_optimizer.OptimizeGraph`` with only ``auto_mixed_precision_cpu`` and
``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16=0`` (see ``tests/_oracle.py``); it includes
Grappler's own overhead (building the GrapplerItem, copying the graph), as any user of the pass
pays it. Ours includes copying the input GraphDef and building the report (decisions are
rendered lazily, so they are not). Goals: ratio <= 1.0 at 100k nodes; 10x the nodes costs
<= 11x the time (growth exponent <= ~1.04).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import graph_pb2  # noqa: E402

from tests import _model_graphs, _oracle  # noqa: E402
from tf_amp.config import RewriteConfig  # noqa: E402
from tf_amp.rewriter import rewrite_graph_def  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import median_ci, verdict  # noqa: E402
from _work import count_python_work  # noqa: E402


def _block_template() -> graph_pb2.GraphDef:
    """One 'layer' of a typical network (13 nodes): a matmul + bias + activations chain with
    a deny-list side branch (Exp -> Sum), the mix that exercises every pass."""
    graph = tf.Graph()
    with graph.as_default():
        v1 = tf.compat.v1
        x = v1.placeholder(tf.float32, [8, 8], name="IN")
        w = tf.constant(np.eye(8, dtype=np.float32), name="w")
        h = tf.nn.bias_add(tf.matmul(x, w, name="mm"), tf.zeros([8]), name="bias")
        h = tf.nn.relu(h, name="relu")
        h = tf.reshape(h, [8, 8], name="reshape")
        h = tf.tanh(h * 0.5, name="tanh")
        tf.reduce_sum(tf.exp(h, name="exp"), name="sum")
        tf.identity(h, name="OUT")
    return graph.as_graph_def()


def synthetic_graph(num_nodes: int) -> graph_pb2.GraphDef:
    """A chain of template blocks with about ``num_nodes`` nodes, built as protos directly."""
    template = _block_template()
    body = [n for n in template.node if n.name != "IN"]
    out = graph_pb2.GraphDef()
    feed = out.node.add()
    feed.CopyFrom(next(n for n in template.node if n.name == "IN"))
    feed.name = "input"
    previous = "input"
    blocks = max(1, (num_nodes - 1) // len(body))
    for b in range(blocks):
        prefix = f"b{b}/"
        for src in body:
            node = out.node.add()
            node.CopyFrom(src)
            node.name = prefix + src.name
            for i, name in enumerate(node.input):
                if name == "IN":
                    node.input[i] = previous
                else:
                    ctrl = name.startswith("^")
                    node.input[i] = ("^" if ctrl else "") + prefix + name.lstrip("^")
        previous = prefix + "OUT"
    return out


def best_of(fn: Callable[[], object], repeat: int, warmup: bool = True) -> float:
    """Best process CPU time of ``repeat`` calls, after one untimed warm-up call.

    CPU time, not wall time: the benchmark machine is shared, and wall time under contention
    varies 2x between identical runs; the best of N drops the runs another process disturbed.
    The warm-up fills one-off caches (op registry, kernel lists, imports) that every later call
    reuses, so they do not land on whichever size is measured first. Each call's result is
    kept until its timer has stopped: freeing it (millions of small objects at 1M nodes) is the
    caller's cost, not the rewrite's, and TensorFlow's side is timed the same way
    (``_oracle.run_tf_pass`` stops its clock before returning the graph).
    """
    if warmup:
        fn()
    times = []
    for _ in range(repeat):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
        del result
    return min(times)


def measure(
    gd: graph_pb2.GraphDef, fetches: list[str], repeat: int, warmup: bool = True
) -> tuple[float, float]:
    """(ours, TF's) best process CPU seconds on the same GraphDef, same fetches."""
    cfg = RewriteConfig(preserve_nodes=frozenset(fetches))
    ours = best_of(lambda: rewrite_graph_def(gd, cfg), repeat, warmup)
    if warmup:
        _oracle.run_tf_pass(gd, fetches)
    theirs = min(_oracle.run_tf_pass(gd, fetches)[1] for _ in range(repeat))
    return ours, theirs


def const_fold_experiment(repeat: int) -> None:
    """Cast(Const) vs a half Const written by the rewrite, on a frozen CNN (weights = Consts).

    Measures rewrite time, GraphDef bytes, first run (includes Grappler) and steady-state step
    time, with Grappler's constant folding on (the default) and off.
    """
    import keras
    from tensorflow.python.framework import convert_to_constants

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            *[keras.layers.Conv2D(64, 3, padding="same", activation="relu") for _ in range(4)],
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    fn = tf.function(lambda x: model(x, training=False))
    concrete = fn.get_concrete_function(tf.TensorSpec((8, 32, 32, 3), tf.float32))
    frozen = convert_to_constants.convert_variables_to_constants_v2(concrete)
    gd = frozen.graph.as_graph_def()
    feed, fetch = frozen.inputs[0].name, frozen.outputs[0].name
    x = np.random.default_rng(0).standard_normal((8, 32, 32, 3)).astype(np.float32)
    print("\nconst folding experiment (frozen 4-conv CNN, batch 8, 32x32):")
    print(f"{'variant':<34}{'rewrite s':>10}{'bytes':>10}{'1st run s':>10}{'min step ms':>12}")
    for fold in (False, True):
        cfg = RewriteConfig(preserve_nodes={fetch.split(":")[0]}, fold_constant_casts=fold)
        seconds = best_of(lambda cfg=cfg: rewrite_graph_def(gd, cfg), repeat)
        out = rewrite_graph_def(gd, cfg).graph_def
        for grappler_folding in (True, False):
            graph = tf.Graph()
            with graph.as_default():
                tf.graph_util.import_graph_def(out, name="")
            config = tf.compat.v1.ConfigProto()
            if not grappler_folding:
                off = config.graph_options.rewrite_options
                off.constant_folding = off.OFF
            with tf.compat.v1.Session(graph=graph, config=config) as sess:
                start = time.perf_counter()
                sess.run(fetch, {feed: x})
                first = time.perf_counter() - start
                steps = []
                for _ in range(40):
                    start = time.perf_counter()
                    sess.run(fetch, {feed: x})
                    steps.append(time.perf_counter() - start)
            label = f"{'half Const' if fold else 'Cast(Const)'}, grappler folding " + (
                "on" if grappler_folding else "off"
            )
            print(
                f"{label:<34}{seconds:>10.4f}{out.ByteSize():>10}{first:>10.3f}"
                f"{1000 * min(steps):>12.2f}"
            )


# Bigger than every cache level of the machines we run on (32 MiB L3 here): writing all of
# it leaves nothing of the previous call in any cache.
_EVICTION_BYTES = 96 << 20


def paired_growth(sizes: list[int], rounds: int) -> None:
    """Growth per 10x nodes with a confidence interval: ours with warm and with cold caches,
    then TensorFlow's pass with warm caches, on the same graphs.

    Two timings of ours per size and round:
    - warm: the mean of back-to-back rewrites of the same graph (100k/size calls, ~0.5 s).
      At 1k nodes the rewrite's working set (600 bytes of Python objects per node, plus the
      input and its protobuf copy) stays in the 1 MiB L2 cache from one call to the next,
      which no larger graph gets.
    - cold: each rewrite starts after a 96 MiB buffer was written, so nothing of the previous
      call is cached (the mean of 30k/size calls). Closer to what a real rewrite sees: it runs
      once per traced graph. From 10k nodes up the two timings agree (the working set does not
      survive between calls anyway); only the small sizes differ.
    TensorFlow's pass, timed after ours, is the reference for what 10x the nodes costs a
    compiled implementation on this machine; up to 100k nodes (one call takes 5 s there, and a
    minute at 1M).
    """
    graphs = {size: synthetic_graph(size) for size in sizes}
    config = RewriteConfig(preserve_nodes=frozenset(["input"]))
    eviction = np.zeros(_EVICTION_BYTES, dtype=np.uint8)

    def ours(size: int, calls: int, evict: bool) -> float:
        total = 0.0
        for _ in range(calls):
            if evict:
                np.add(eviction, 1, out=eviction)  # untimed: writes every byte
            start = time.process_time()
            result = rewrite_graph_def(graphs[size], config)
            total += time.process_time() - start
            del result
        return total / calls

    def tensorflow(size: int) -> float:
        calls = max(1, 50_000 // size)
        return sum(_oracle.run_tf_pass(graphs[size], ["input"])[1] for _ in range(calls)) / calls

    for size in sizes:
        ours(size, 1, evict=False)  # warm-up: caches, imports, first-touch pages
    _print_paired_growth(
        graphs,
        sizes,
        rounds,
        {
            "ours, warm caches": lambda size: ours(size, max(1, 100_000 // size), evict=False),
            "ours, cold caches": lambda size: ours(size, max(1, 30_000 // size), evict=True),
        },
    )
    tf_sizes = [s for s in sizes if s <= 100_000]
    for size in tf_sizes:
        _oracle.run_tf_pass(graphs[size], ["input"])  # warm-up
    _print_paired_growth(graphs, tf_sizes, rounds, {"TensorFlow's pass, warm caches": tensorflow})


def _print_paired_growth(
    graphs: dict[int, graph_pb2.GraphDef],
    sizes: list[int],
    rounds: int,
    timers: dict[str, Callable[[int], float]],
) -> None:
    """Times every size with every timer (seconds per call) in each round, the order of the
    sizes rotating, and prints each timer's growth per 10x nodes: the median of the rounds
    with a 95% bootstrap interval and the <= 11x verdict.

    Why paired: on a shared virtual machine the same rewrite varies by +-10% from one run to
    the next, more than the distance between the goal (11x) and what is measured; each round
    gives one growth figure per pair of sizes from timings taken moments apart.
    """
    if len(sizes) < 2:
        return
    pairs = list(zip(sizes, sizes[1:], strict=False))
    node_ratio = {(a, b): len(graphs[b].node) / len(graphs[a].node) for a, b in pairs}
    growth: dict[str, dict[tuple[int, int], list[float]]] = {
        label: {pair: [] for pair in pairs} for label in timers
    }
    per_node: dict[str, dict[int, list[float]]] = {
        label: {size: [] for size in sizes} for label in timers
    }
    for r in range(rounds):
        seconds: dict[str, dict[int, float]] = {label: {} for label in timers}
        for size in sizes[r % len(sizes) :] + sizes[: r % len(sizes)]:
            for label, timer in timers.items():
                seconds[label][size] = timer(size)
        for label in timers:
            for size in sizes:
                per_node[label][size].append(seconds[label][size] / len(graphs[size].node))
            for (small, large), nodes in node_ratio.items():
                ratio = seconds[label][large] / seconds[label][small]
                growth[label][(small, large)].append(per_10x(ratio, nodes)[0])
    for label in timers:
        print(f"\n{label}, paired growth per 10x nodes ({rounds} rounds, process CPU):")
        for (small, large), values in growth[label].items():
            median, low, high = median_ci(values)
            print(
                f"  {small:>8} -> {large:>8}: x{median:5.2f}  95% CI [x{low:5.2f}, x{high:5.2f}]"
                f"  (rounds: {min(values):.2f} to {max(values):.2f})  goal <= 11x: "
                f"{verdict(low, high, 11.0)}"
            )
        times = ", ".join(
            f"{size}: {1e6 * float(np.median(v)):.2f}" for size, v in per_node[label].items()
        )
        print(f"  median us per node: {times}")


def work_per_node(sizes: list[int]) -> None:
    """Python bytecodes, C-function calls and peak Python memory of one rewrite, per node.

    Deterministic, unlike the timings: if they are flat across sizes while the time per node
    rises, the rewrite does the same work per node at every size and the excess growth is each
    operation getting dearer (caches, page faults), not an algorithm worse than linear.
    """
    import tracemalloc

    config = RewriteConfig(preserve_nodes=frozenset(["input"]))
    print("\nours, work per node of one rewrite (after a warm-up rewrite of the same graph):")
    print(f"{'nodes':>9}{'bytecodes':>11}{'C calls':>9}{'peak B':>8}   (ratios to the smallest)")
    first: tuple[float, float, float] | None = None
    for size in sizes:
        gd = synthetic_graph(size)
        n = len(gd.node)
        rewrite_graph_def(gd, config)
        bytecodes, c_calls = count_python_work(lambda gd=gd: rewrite_graph_def(gd, config))
        tracemalloc.start()
        result = rewrite_graph_def(gd, config)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del result
        row = (bytecodes / n, c_calls / n, peak / n)
        first = first or row
        ratios = "  ".join(f"x{value / base:.3f}" for value, base in zip(row, first, strict=True))
        print(f"{n:>9}{row[0]:>11.1f}{row[1]:>9.2f}{row[2]:>8.0f}   {ratios}")
        del gd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--max-nodes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--const-fold", action="store_true", help="only the folding experiment")
    parser.add_argument(
        "--growth-rounds",
        type=int,
        default=0,
        help="only growth per 10x nodes (ours warm and cold, TF's warm), paired over N rounds",
    )
    parser.add_argument(
        "--work-per-node",
        action="store_true",
        help="only our bytecodes, C calls and peak Python memory per node (deterministic)",
    )
    args = parser.parse_args(argv)

    import logging

    logging.getLogger("tf_amp").setLevel(logging.WARNING)
    if args.const_fold:
        const_fold_experiment(args.repeat)
        return 0
    sizes = [s for s in (1_000, 10_000, 100_000, 1_000_000) if s <= args.max_nodes]
    if args.growth_rounds:
        paired_growth(sizes, args.growth_rounds)
        return 0
    if args.work_per_node:
        work_per_node([s for s in sizes if s <= 100_000])  # traced: ~15x slower than a rewrite
        return 0
    print(
        "process CPU seconds, best of --repeat after one untimed warm-up call "
        "(at 1M nodes: 1 timed call after the warm-up)"
    )
    print(f"{'graph':<22}{'nodes':>9}{'ours s':>10}{'TF s':>10}{'ratio':>8}")
    if not args.skip_real:
        for name, builder in _model_graphs.ALL_BUILDERS.items():
            model = builder()
            ours, theirs = measure(model.graph_def, model.fetches, args.repeat)
            n = len(model.graph_def.node) + sum(
                len(f.node_def) for f in model.graph_def.library.function
            )
            print(f"{name:<22}{n:>9}{ours:>10.4f}{theirs:>10.4f}{ours / theirs:>8.2f}")
    rows = []
    for size in sizes:
        gd = synthetic_graph(size)
        # One timed call at 1M (a TF call takes a minute there), still after a warm-up: a
        # first call at a new peak size also pays the kernel for first-touching ~1 GB of
        # fresh pages (+2 s of system time for ours), which no later call sees.
        ours, theirs = measure(gd, ["input"], args.repeat if size < 1_000_000 else 1)
        rows.append((len(gd.node), ours, theirs))
        ratio = ours / theirs
        print(f"{'synthetic':<22}{len(gd.node):>9}{ours:>10.4f}{theirs:>10.4f}{ratio:>8.2f}")
        del gd
    print_growth(rows)
    return 0


def per_10x(time_ratio: float, node_ratio: float) -> tuple[float, float]:
    """(time factor for exactly 10x the nodes, exponent): the synthetic sizes are 10x apart
    only approximately, so the measured time ratio is scaled along the fitted power law."""
    exponent = math.log(time_ratio) / math.log(node_ratio)
    return 10**exponent, exponent


def print_growth(rows: list[tuple[int, float, float]]) -> None:
    """Time ratio per step in size, normalised to exactly 10x the nodes (the synthetic sizes
    are 10x apart only approximately), with the exponent and the <= 11x goal marked."""
    if len(rows) < 2:
        return
    print(
        "\ngrowth per 10x nodes (t2/t1 scaled to 10x nodes; exponent = log(t2/t1) / log(n2/n1);"
        " goal: ours <= 11x at every step)"
    )
    for (n1, o1, t1), (n2, o2, t2) in zip(rows, rows[1:], strict=False):
        g_ours, e_ours = per_10x(o2 / o1, n2 / n1)
        g_tf, e_tf = per_10x(t2 / t1, n2 / n1)
        mark = "ok" if g_ours <= 11.0 else "OVER"
        print(
            f"  {n1:>8} -> {n2:>8}: ours x{g_ours:5.2f} (n^{e_ours:.3f}) {mark:<4}  "
            f"TF x{g_tf:5.2f} (n^{e_tf:.3f})   [raw: ours x{o2 / o1:.2f}, TF x{t2 / t1:.2f} "
            f"for x{n2 / n1:.2f} nodes]"
        )


if __name__ == "__main__":
    raise SystemExit(main())
