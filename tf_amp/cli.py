"""``tf-amp``: rewrite graphs offline, inspect a log directory, show the effective op lists.

    tf-amp rewrite IN OUT [--target-dtype float16] [--opt-level O1] [--preserve a,b] ...
        IN is a GraphDef (.pb binary, .pbtxt/.txt text) or a SavedModel directory; OUT gets the
        same kind. Library functions (where a TF2 SavedModel keeps its bodies) are rewritten too.
    tf-amp inspect LOGDIR
        Per rewritten graph in a log directory (TF_AMP_LOG_PATH / RewriteConfig.log_dir): the
        summary line, ops converted by type, casts, and the float32 islands and why they stayed.
    tf-amp lists [--target-dtype float16] [--json]
        The allow / infer / clear / deny lists after the environment's overrides.

Every subcommand reads the environment through ``RewriteConfig.from_env`` (the one place that
does), so what it shows or does is what a training run in the same shell would do.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from typing import Any

_TEXT_SUFFIXES = (".pbtxt", ".txt", ".pb.txt")
_SOURCE_OPS = frozenset(
    {"Const", "Placeholder", "VarHandleOp", "ReadVariableOp", "VariableV2", "_Arg", "_Retval"}
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tf-amp`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return int(args.handler(args) or 0)
    except (ValueError, OSError) as error:  # bad input, missing / wrong kind of path
        print(f"tf-amp {args.command}: error: {error}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tf-amp", description="Automatic mixed precision for TensorFlow graphs."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    rewrite = sub.add_parser("rewrite", help="rewrite a GraphDef or SavedModel")
    rewrite.add_argument("input", help="GraphDef file (.pb / .pbtxt) or SavedModel directory")
    rewrite.add_argument("output", help="where to write the rewritten GraphDef / SavedModel")
    rewrite.add_argument("--target-dtype", choices=("auto", "float16", "bfloat16"))
    rewrite.add_argument("--opt-level", choices=("O0", "O1", "O2", "O3"))
    rewrite.add_argument("--devices", choices=("all", "gpu"), help="eligible devices")
    rewrite.add_argument(
        "--preserve",
        default="",
        help="comma-separated node names to keep (GraphDef default: the graph's outputs, "
        "nodes nothing reads)",
    )
    rewrite.add_argument(
        "--preserve-names", action="store_true", help="keep every original name's dtype"
    )
    rewrite.add_argument("--exclude-scope", action="append", default=[], help="keep float32")
    rewrite.add_argument("--log-dir", help="write before/after graphs and decisions here")
    rewrite.add_argument(
        "--probe", action="store_true", help="time allow/infer ops first; keep slow ones float32"
    )
    rewrite.add_argument(
        "--no-kernel-check",
        action="store_true",
        help="trust the OpDef (rewrite for a GPU on a machine without GPU kernels)",
    )
    rewrite.set_defaults(handler=_cmd_rewrite)

    inspect = sub.add_parser("inspect", help="summarise a rewrite log directory")
    inspect.add_argument("logdir")
    inspect.add_argument("--islands", type=int, default=5, help="float32 islands to show")
    inspect.set_defaults(handler=_cmd_inspect)

    lists = sub.add_parser("lists", help="show the effective op lists")
    lists.add_argument("--target-dtype", choices=("auto", "float16", "bfloat16"))
    lists.add_argument("--json", action="store_true", help="machine-readable output")
    lists.set_defaults(handler=_cmd_lists)

    probe = sub.add_parser(
        "probe", help="time a GraphDef's allow/infer ops in float32 and in the target here"
    )
    probe.add_argument("input", help="GraphDef file (.pb / .pbtxt)")
    probe.add_argument("--target-dtype", choices=("auto", "float16", "bfloat16"))
    probe.add_argument("--repeats", type=int, default=5, help="interleaved rounds per op")
    probe.set_defaults(handler=_cmd_probe)
    return parser


# --------------------------------------------------------------------------- rewrite


def _config_from_args(args: argparse.Namespace) -> Any:
    from tf_amp.config import RewriteConfig

    overrides: dict[str, Any] = {}
    if args.target_dtype:
        overrides["target_dtype"] = args.target_dtype
    if args.opt_level:
        overrides["opt_level"] = args.opt_level
    if args.devices:
        overrides["eligible_devices"] = args.devices
    if args.preserve:
        overrides["preserve_nodes"] = frozenset(_split(args.preserve))
    if args.preserve_names:
        overrides["preserve_names"] = True
    if args.exclude_scope:
        overrides["exclude_scopes"] = tuple(args.exclude_scope)
    if args.log_dir:
        overrides["log_dir"] = args.log_dir
    if args.no_kernel_check:
        overrides["check_kernels"] = False
    if args.probe:
        overrides["probe"] = True
    return RewriteConfig.from_env(**overrides)


def _cmd_rewrite(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    if os.path.isdir(args.input):
        reports = rewrite_saved_model(args.input, args.output, config)
    else:
        if os.path.isdir(args.output):
            raise IsADirectoryError(f"OUT {args.output} is a directory; give a GraphDef file")
        both = os.path.exists(args.input) and os.path.exists(args.output)
        if both and os.path.samefile(args.input, args.output):
            raise ValueError("OUT must differ from IN (the GraphDef is copied, not edited)")
        reports = [rewrite_graph_def_file(args.input, args.output, config)]
    if reports:
        print(f"target: {reports[0].target_dtype} ({reports[0].target_reason})")
    for i, report in enumerate(reports):
        where = f"MetaGraph {i}: " if len(reports) > 1 else ""
        line = report.summary_line() if report.changed else "nothing to do (graph unchanged)"
        print(where + line)
    print(f"wrote {args.output}")
    return 0


def read_graph_def(path: str) -> Any:
    """A GraphDef from a binary or text file (text by suffix, else tried as both)."""
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    data = _read_bytes(path)
    if path.endswith(_TEXT_SUFFIXES):
        try:
            text_format.Parse(data.decode("utf-8"), graph_def)
        except (text_format.ParseError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is not a text GraphDef: {error}") from None
        return graph_def
    try:
        graph_def.ParseFromString(data)
    except Exception:  # noqa: BLE001 - fall back to text, then report both failures
        try:
            text_format.Parse(data.decode("utf-8"), graph_def)
        except Exception as error:
            raise ValueError(f"{path} is neither a binary nor a text GraphDef") from error
    return graph_def


def write_graph_def(graph_def: Any, path: str) -> None:
    from google.protobuf import text_format

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(_TEXT_SUFFIXES):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text_format.MessageToString(graph_def))
    else:
        with open(path, "wb") as f:
            f.write(graph_def.SerializeToString())


def rewrite_graph_def_file(source: str, target: str, config: Any) -> Any:
    """Rewrites one GraphDef file; returns the report.

    A GraphDef names no fetches, so without ``--preserve`` its outputs (the nodes nothing
    reads: a frozen model's logits, say) are preserved: whoever runs the file fetches them by
    name and expects the dtype they had.
    """
    from tf_amp.rewriter import rewrite_graph_def

    graph_def = read_graph_def(source)
    if not config.preserve_nodes:
        config = config.replace(preserve_nodes=_outputs(graph_def))
    result = rewrite_graph_def(graph_def, config)
    write_graph_def(result.graph_def, target)
    return result.report


def _outputs(graph_def: Any) -> frozenset[str]:
    """Main-graph nodes that no node reads (through a data or a control input)."""
    read = {text.lstrip("^").split(":")[0] for node in graph_def.node for text in node.input}
    return frozenset(node.name for node in graph_def.node if node.name not in read)


def rewrite_saved_model(source: str, target: str, config: Any) -> Any:
    """Copies a SavedModel, rewriting every MetaGraph's GraphDef and function library.

    Variables and assets are copied unchanged: the rewrite never changes a variable's name or
    dtype, so the checkpoint in ``variables/`` still matches. Signature outputs are preserved
    (their dtypes do not change) because the signatures' nodes are added to ``preserve_nodes``.
    Returns one report per MetaGraph.

    OUT is replaced only when it is an earlier output of this command (it carries the
    ``assets.extra/tf_amp_rewrite.json`` marker) or an empty directory, and never when it is or
    contains IN: anything else there is the user's, and is not ours to delete.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    from tf_amp.rewriter import rewrite_graph_def

    pb_path = os.path.join(source, "saved_model.pb")
    if not os.path.exists(pb_path):
        raise FileNotFoundError(f"{source} is a directory without saved_model.pb")
    _check_saved_model_target(source, target)
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString(_read_bytes(pb_path))
    reports = []
    for meta_graph in saved_model.meta_graphs:
        keep = {
            tensor.name.split(":")[0]
            for signature in meta_graph.signature_def.values()
            for tensor in list(signature.outputs.values()) + list(signature.inputs.values())
        }
        effective = config.replace(preserve_nodes=frozenset(config.preserve_nodes) | keep)
        result = rewrite_graph_def(meta_graph.graph_def, effective)
        meta_graph.graph_def.CopyFrom(result.graph_def)
        reports.append(result.report)
    if os.path.exists(target):
        shutil.rmtree(target)
    # fingerprint.pb describes the original saved_model.pb: it is made anew below.
    ignore = shutil.ignore_patterns("saved_model.pb", _FINGERPRINT)
    shutil.copytree(source, target, ignore=ignore)
    with open(os.path.join(target, "saved_model.pb"), "wb") as f:
        f.write(saved_model.SerializeToString())
    if os.path.exists(os.path.join(source, _FINGERPRINT)):
        _write_fingerprint(target)
    marker = os.path.join(target, _MARKER)
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(marker, "w", encoding="utf-8") as f:
        json.dump({"rewritten_from": os.path.abspath(source), "tool": "tf-amp rewrite"}, f)
    return reports


_FINGERPRINT = "fingerprint.pb"
# Marks a directory as written by `tf-amp rewrite`, so a later run may replace it
# (assets.extra is where a SavedModel keeps files TensorFlow does not read).
_MARKER = os.path.join("assets.extra", "tf_amp_rewrite.json")


def _check_saved_model_target(source: str, target: str) -> None:
    """Refuses an OUT whose replacement would destroy IN or files that are not ours."""
    source_path, target_path = os.path.realpath(source), os.path.realpath(target)
    if source_path == target_path:
        raise ValueError("OUT must differ from IN (the SavedModel is copied, not edited)")
    if os.path.commonpath([source_path, target_path]) == target_path:
        raise ValueError(f"OUT {target} contains IN {source}; it would be deleted")
    if os.path.isdir(target) and os.listdir(target):
        if not os.path.exists(os.path.join(target, _MARKER)):
            raise FileExistsError(
                f"OUT {target} is a non-empty directory that tf-amp did not write; remove it "
                "or choose another path (only an earlier tf-amp output is replaced)"
            )
    elif os.path.exists(target) and not os.path.isdir(target):
        raise FileExistsError(f"OUT {target} is a file; a SavedModel is a directory")


def _write_fingerprint(export_dir: str) -> None:
    """Writes the fingerprint of the rewritten SavedModel, as tf.saved_model.save does."""
    from tf_amp._upstream.tensorflow import fingerprinting

    serialized = fingerprinting.CreateFingerprintDef(export_dir)
    with open(os.path.join(export_dir, _FINGERPRINT), "wb") as f:
        f.write(serialized)


# --------------------------------------------------------------------------- inspect


def _cmd_inspect(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.logdir):
        raise NotADirectoryError(f"{args.logdir} is not a directory")
    graphs = find_logged_graphs(args.logdir)
    if not graphs:
        print(f"no rewrite logs in {args.logdir} (files decisions_AutoMixedPrecision_*.jsonl)")
        return 1
    for stamp, files in graphs.items():
        print(format_graph_summary(stamp, files, args.islands))
    return 0


def find_logged_graphs(logdir: str) -> dict[str, dict[str, str]]:
    """{stamp: {"decisions"|"before"|"after": path}} for each logged rewrite, oldest first."""
    prefixes = {
        "decisions_AutoMixedPrecision_": ("decisions", ".jsonl"),
        "graphdef_preop_": ("before", ".pb"),
        "graphdef_AutoMixedPrecision_": ("after", ".pb"),
    }
    found: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for name in os.listdir(logdir):
        for prefix, (kind, suffix) in prefixes.items():
            if name.startswith(prefix) and name.endswith(suffix):
                found[name[len(prefix) : -len(suffix)]][kind] = os.path.join(logdir, name)
    # Our stamps end in a counter; files that only share a prefix (a copied graph) are not ours.
    ours = [s for s in found if "decisions" in found[s] and s.rsplit("_", 1)[-1].isdigit()]
    ordered = sorted(ours, key=lambda stamp: int(stamp.rsplit("_", 1)[-1]))
    return {stamp: found[stamp] for stamp in ordered}


def format_graph_summary(stamp: str, files: dict[str, str], max_islands: int = 5) -> str:
    """The text ``tf-amp inspect`` prints for one logged rewrite."""
    with open(files["decisions"], encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines:
        return f"== graph {stamp}\n  (empty decisions file {files['decisions']})"
    head, decisions = lines[0], lines[1:]
    out = [f"== graph {stamp}", f"  {head.get('summary', '')}"]
    if head.get("target_reason"):
        out.append(f"  target: {head.get('target_dtype')} ({head['target_reason']})")
    if "after" in files:
        after = read_graph_def(files["after"])
        converted = converted_ops_by_type(after)
        if converted:
            out.append("  ops converted to 16-bit, by type:")
            out.extend(f"    {op:<28} {count}" for op, count in converted.most_common())
        to_half, to_float = count_casts(after)
        out.append(f"  casts: {to_half} to 16-bit, {to_float} back to float32 (all bodies)")
    before = read_graph_def(files["before"]) if "before" in files else None
    islands = float32_islands(decisions, before)
    out.append(f"  float32 islands: {len(islands)}")
    for island in islands[:max_islands]:
        ops = collections.Counter(d["op"] for d in island)
        reasons = collections.Counter(d["reason"] for d in island)
        body = island[0].get("body") or "main graph"
        shown_ops = ", ".join(f"{op} x{n}" for op, n in ops.most_common(4))
        out.append(f"    - {len(island)} node(s) in {body}: {shown_ops}")
        for reason, n in reasons.most_common(2):
            out.append(f"        why ({n}): {reason}")
    return "\n".join(out)


def converted_ops_by_type(graph_def: Any) -> collections.Counter:
    """Op types (not Casts) with a 16-bit type attr, over the main graph and the library."""
    from tensorflow.core.framework import types_pb2

    half = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16)
    counts: collections.Counter = collections.Counter()
    for node in _all_nodes(graph_def):
        if node.op == "Cast":
            continue
        if any(
            attr.type in half or any(t in half for t in attr.list.type)
            for attr in node.attr.values()
        ):
            counts[node.op] += 1
    return counts


def count_casts(graph_def: Any) -> tuple[int, int]:
    from tensorflow.core.framework import types_pb2

    half = (types_pb2.DT_HALF, types_pb2.DT_BFLOAT16)
    to_half = to_float = 0
    for node in _all_nodes(graph_def):
        if node.op != "Cast":
            continue
        src, dst = node.attr["SrcT"].type, node.attr["DstT"].type
        if dst in half and src == types_pb2.DT_FLOAT:
            to_half += 1
        elif src in half and dst == types_pb2.DT_FLOAT:
            to_float += 1
    return to_half, to_float


def float32_islands(decisions: list[dict[str, Any]], before: Any) -> list[list[dict[str, Any]]]:
    """Connected groups of float32 compute nodes (constants, feeds, variables left out).

    Connectivity comes from the graph before the rewrite; without it each node is its own
    island. Largest first.
    """
    kept = {
        (d.get("body", ""), d["node"]): d
        for d in decisions
        if d.get("paint") != "allow"
        and d.get("dtype", "float32") == "float32"
        and d.get("op") not in _SOURCE_OPS
        and not str(d.get("reason", "")).startswith("constant, feed or variable")
    }
    parent = {key: key for key in kept}

    def find(key: tuple[str, str]) -> tuple[str, str]:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    if before is not None:
        for body, nodes in _bodies(before):
            for node in nodes:
                here = (body, node.name)
                if here not in kept:
                    continue
                for name in node.input:
                    source = (body, name.lstrip("^").split(":")[0])
                    if source in kept:
                        parent[find(here)] = find(source)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for key, decision in kept.items():
        groups[find(key)].append(decision)
    return sorted(groups.values(), key=len, reverse=True)


def _bodies(graph_def: Any) -> Iterable[tuple[str, Any]]:
    yield "", graph_def.node
    for function in graph_def.library.function:
        yield function.signature.name, function.node_def


def _all_nodes(graph_def: Any) -> Iterable[Any]:
    for _, nodes in _bodies(graph_def):
        yield from nodes


# --------------------------------------------------------------------------- lists


def _cmd_probe(args: argparse.Namespace) -> int:
    from tf_amp import probe
    from tf_amp.config import RewriteConfig

    overrides = {"target_dtype": args.target_dtype} if args.target_dtype else {}
    config = RewriteConfig.from_env(**overrides)
    print(f"target: {config.target_dtype} ({config.target_reason})")
    if not config.rewrites:
        print("nothing to time: the target is float32")
        return 0
    graph_def = read_graph_def(args.input)
    lists = config.resolved_lists()
    categories = {op: lists.category(op) for op in {n.op for n in graph_def.node}}
    timings = probe.probe_graph(graph_def, config.target_dtype, categories, args.repeats)
    print(f"{'op at its input shapes':<60} {'list':<6} {'float32':>10} "
          f"{config.target_dtype:>10} {'ratio':>6}  nodes  decision")
    for t in sorted(timings, key=lambda t: -t.float32_s):
        decision = "keep float32" if t.keep_float32 else config.target_dtype
        print(f"{t.signature.describe()[:60]:<60} {t.category:<6} {t.float32_s * 1e3:>8.3f}ms "
              f"{t.reduced_s * 1e3:>8.3f}ms {t.ratio:>6.2f}  {len(t.nodes):>5}  {decision}")
    slow = probe.slow_nodes(timings)
    print(f"{len(timings)} op signatures timed; {len(slow)} node(s) kept float32")
    return 0


def _cmd_lists(args: argparse.Namespace) -> int:
    from tf_amp.config import RewriteConfig

    overrides = {"target_dtype": args.target_dtype} if args.target_dtype else {}
    config = RewriteConfig.from_env(**overrides)
    lists = config.resolved_lists().as_dict()
    if args.json:
        print(json.dumps({"target_dtype": config.target_dtype, **lists}, indent=2))
        return 0
    print(f"effective lists for {config.target_dtype} (defaults + environment overrides)")
    print(f"target: {config.target_dtype} ({config.target_reason})")
    if config.level:
        print(f"level: {config.level}")
    for name, ops in lists.items():
        print(f"{name} ({len(ops)}): {', '.join(ops)}")
    return 0


# --------------------------------------------------------------------------- helpers


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


if __name__ == "__main__":
    sys.exit(main())
