"""An embedding lookup rewritten by tf_amp, with and without the table lookups rule.

TensorFlow's pass paints a gather of a weight table half by casting the whole table every
step; tf_amp (``RewriteConfig.select_before_cast``, on by default) keeps the gather float32 and
casts the rows it selects (``tf_amp/painter/table_selection.py``). This times the two rewrites
of the same ``tf_amp.function`` (a lookup of batch x seq tokens in a vocab x d_model table, the
rows feeding a MatMul, so the painter wants them half), in paired, interleaved rounds, and
prints the ratio with a 95% interval. Proof of what ran: each rewritten graph's dtypes (which
node the Cast to the target reads), and both give the same bits.

    python bench/table_lookup.py                        # bench BERT's 8,000 rows and BERT-base's
    python bench/table_lookup.py --vocab 250000 --target float16
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import median_ci  # noqa: E402


def _lookup_functions(vocab: int, d_model: int, target: str) -> dict[str, object]:
    """{"rows cast": fn, "table cast": fn}: the same lookup under the two rewrites."""
    import numpy as np
    import tensorflow as tf

    import tf_amp
    from tf_amp.config import RewriteConfig

    rng = np.random.default_rng(0)
    table = tf.Variable(rng.standard_normal((vocab, d_model)).astype(np.float32))
    w = tf.Variable(rng.standard_normal((d_model, 8)).astype(np.float32))

    def lookup(ids: tf.Tensor) -> tf.Tensor:
        # As Keras's Embedding reads it: ops.take converts the variable to a tensor first
        # (ReadVariableOp -> GatherV2). tf.gather(variable) would be a ResourceGather, which
        # reads only the rows and never casts the table.
        rows = tf.reshape(tf.gather(table.value(), ids), [-1, d_model])
        return tf.matmul(rows, w)

    functions = {
        label: tf_amp.function(lookup, config=RewriteConfig(
            target_dtype=target, select_before_cast=select))
        for label, select in (("rows cast", True), ("table cast", False))
    }
    return functions


def _what_ran(function: object) -> str:
    """Which tensor the rewritten graph casts to the target: the table or the gathered rows."""
    (concrete,) = function.rewritten_concrete_functions()  # type: ignore[attr-defined]
    nodes = {n.name: n for n in concrete.graph.as_graph_def().node}
    casts = [n for n in nodes.values() if n.op == "Cast" and n.name.endswith("-tf_amp")]
    what = []
    for cast in (c for c in casts if c.attr["DstT"].type in (14, 19)):  # bfloat16, half
        gathers_it = any(n.op == "GatherV2" and n.input[0].split(":")[0] == cast.name
                         for n in nodes.values())
        source = nodes[cast.input[0].split(":")[0]]
        what.append("the gathered rows" if source.op == "GatherV2" else
                    "the whole table" if gathers_it else "a weight")
    return "casts to the target: " + ", ".join(sorted(what))


def run(vocab: int, d_model: int, tokens: int, target: str, rounds: int, calls: int) -> None:
    import numpy as np
    import tensorflow as tf

    functions = _lookup_functions(vocab, d_model, target)
    ids = tf.constant(np.random.default_rng(1).integers(0, vocab, (tokens,)).astype(np.int32))
    results = {label: fn(ids).numpy() for label, fn in functions.items()}
    same = np.array_equal(results["rows cast"], results["table cast"])
    times: dict[str, list[float]] = {label: [] for label in functions}
    labels = list(functions)
    for r in range(rounds):
        for label in labels if r % 2 else labels[::-1]:
            start = time.perf_counter()
            for _ in range(calls):
                functions[label](ids)
            times[label].append((time.perf_counter() - start) / calls)
    ratio = median_ci([a / b for a, b in zip(times["rows cast"], times["table cast"],
                                              strict=True)])
    print(f"table {vocab} x {d_model}, {tokens} tokens, {target}:")
    for label, fn in functions.items():
        print(f"  {label:<10} {np.median(times[label]) * 1e3:8.2f} ms a call  ({_what_ran(fn)})")
    print(f"  rows cast / table cast: {ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]; "
          f"same bits: {same}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", default="8000,30522", help="comma-separated table rows")
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--tokens", type=int, default=8 * 128, help="batch x sequence")
    parser.add_argument("--target", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    args = parser.parse_args()
    for vocab in (int(v) for v in args.vocab.split(",")):
        run(vocab, args.d_model, args.tokens, args.target, args.rounds, args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
