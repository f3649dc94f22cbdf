"""``tf-amp lists``: the effective op lists; ``tf-amp probe IN``: an op-by-op timing."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from tf_amp.cli.graph_files import read_graph_def
from tf_amp.cli.rewrite_command import config_from_env


def run_lists(args: argparse.Namespace) -> int:
    """``tf-amp lists``: the lists after the environment's overrides (text or JSON)."""
    config = config_from_env(args.target_dtype)
    lists = config.resolved_lists().as_dict()
    # A float32 target rewrites nothing: the lists shown are the float16 ones, which it
    # would use if forced, and are not called effective.
    listed_for = config.target_dtype if config.target_dtype != "float32" else "float16"
    if args.json:
        print(json.dumps({"target_dtype": config.target_dtype, "rewrites": config.rewrites,
                          "lists_for": listed_for, **lists}, indent=2))
        return 0
    if config.rewrites:
        print(f"effective lists for {listed_for} (defaults + environment overrides)")
    else:
        why = (f"the {config.target_dtype} target" if config.target_dtype == "float32"
               else f"opt level {config.opt_level}")
        print(f"{why} rewrites nothing; the lists a {listed_for} target would use "
              "(defaults + environment overrides):")
    print(f"target: {config.target_dtype} ({config.target_reason})")
    if config.level:
        print(f"level: {config.level}")
    for name, ops in lists.items():
        print(f"{name} ({len(ops)}): {', '.join(ops)}")
    return 0


def run_probe(args: argparse.Namespace) -> int:
    """``tf-amp probe``: each allow/infer op of a GraphDef timed in float32 and the target."""
    from tf_amp import probe

    # The input first: a missing or unreadable file is an error whatever the target, not
    # hidden behind "nothing to time" where the target resolves to float32.
    graph_def = read_graph_def(args.input)
    config = config_from_env(args.target_dtype)
    print(f"target: {config.target_dtype} ({config.target_reason})")
    if not config.rewrites:
        print("nothing to time: the target is float32")
        return 0
    lists = config.resolved_lists()
    categories = {op: lists.category(op) for op in {n.op for n in graph_def.node}}
    try:
        timings = probe.probe_graph(graph_def, config.target_dtype, categories, args.repeats)
    except ValueError as error:  # what the rewrite's probe would skip with a warning
        raise ValueError(f"the probe could not run on {args.input}: {error}") from None
    print(f"{'op at its input shapes':<60} {'list':<6} {'float32':>10} "
          f"{config.target_dtype:>10} {'ratio':>6}  nodes  decision")
    alike = Counter(t.signature.describe() for t in timings)
    for t in sorted(timings, key=lambda t: -t.float32_s):
        decision = "keep float32" if t.keep_float32 else config.target_dtype
        print(f"{t.signature.describe()[:60]:<60} {t.category:<6} {t.float32_s * 1e3:>8.3f}ms "
              f"{t.reduced_s * 1e3:>8.3f}ms {t.ratio:>6.2f}  {len(t.nodes):>5}  {decision}")
        if alike[t.signature.describe()] > 1:  # rows alike but for attrs: say which is which
            print(f"    {t.signature.details or '(no attributes)'}")
    for untimed in timings.untimed:
        print(f"not timed: {untimed.describe()}")
    slow = probe.slow_nodes(timings)
    skipped = sum(len(u.nodes) for u in timings.untimed)
    print(f"{len(timings)} op signatures timed; {len(slow)} node(s) kept float32"
          + (f"; {skipped} node(s) not timed" if skipped else ""))
    return 0
