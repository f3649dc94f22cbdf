"""``tf-amp inspect LOGDIR``: per logged rewrite, what changed and the float32 islands and why."""

from __future__ import annotations

import argparse
import collections
import json
import os
from collections.abc import Iterable
from typing import Any

from tf_amp.cli.graph_files import read_graph_def

# DT_HALF and DT_BFLOAT16 (types.proto), spelled out: importing TensorFlow's protos here would
# import TensorFlow before the command has parsed its arguments.
_HALF = (19, 14)

_SOURCE_OPS = frozenset(
    {"Const", "Placeholder", "VarHandleOp", "ReadVariableOp", "VariableV2", "_Arg", "_Retval"}
)
# What the summary reads from each decision record (tf_amp.report.VertexDecision.as_dict).
_DECISION_KEYS = ("node", "op", "reason")


def run(args: argparse.Namespace) -> int:
    """``tf-amp inspect``: one summary per logged rewrite; 1 when the directory has none."""
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
    # Our stamps are pid_counter_milliseconds; files that only share a prefix (a copied
    # graph) are not ours. Oldest first: by time, then by the process's counter (one
    # millisecond can hold several rewrites).
    ours = [s for s in found if "decisions" in found[s] and _stamp_order(s) is not None]
    ordered = sorted(ours, key=_stamp_order)
    return {stamp: found[stamp] for stamp in ordered}


def _stamp_order(stamp: str) -> tuple[int, int] | None:
    parts = stamp.rsplit("_", 2)
    if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    return int(parts[2]), int(parts[1])


def format_graph_summary(stamp: str, files: dict[str, str], max_islands: int = 5) -> str:
    """The text ``tf-amp inspect`` prints for one logged rewrite."""
    lines = read_decisions(files["decisions"])
    if not lines:
        return f"== graph {stamp}\n  (empty decisions file {files['decisions']})"
    head, decisions = lines[0], lines[1:]
    name = f" ({head['graph_name']})" if head.get("graph_name") else ""
    out = [f"== graph {stamp}{name}", f"  {head.get('summary', '')}"]
    if head.get("target_reason"):
        out.append(f"  target: {head.get('target_dtype')} ({head['target_reason']})")
    before = read_graph_def(files["before"]) if "before" in files else None
    if "after" in files:
        after = read_graph_def(files["after"])
        converted = converted_ops_by_type(after, before)
        if converted:
            out.append("  ops converted to 16-bit, by type:")
            out.extend(f"    {op:<28} {count}" for op, count in converted.most_common())
        to_half, to_float = count_casts(after, before)
        out.append(f"  casts: {to_half} to 16-bit, {to_float} back to float32 (all bodies)")
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


def read_decisions(path: str) -> list[dict[str, Any]]:
    """A decisions file's records: the head, then one per (node, type attribute).

    Each line must be a JSON object and each decision must name its node, op and reason (what
    the summary counts): a damaged line is a ValueError naming the file and line, so the user
    learns which file to look at instead of a bare JSON message or a traceback.
    """
    records = []
    with open(path, "rb") as f:  # bytes: json.loads reports a line that is not UTF-8 too
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error.msg}, column {error.colno})") from None
            except UnicodeDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error.reason})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: a {type(record).__name__}, not a JSON object")
            if records:  # every line after the head is a decision
                _check_decision(record, where)
            records.append(record)
    return records


def _check_decision(record: dict[str, Any], where: str) -> None:
    missing = [key for key in _DECISION_KEYS if key not in record]
    if missing:
        raise ValueError(f"{where}: a decision without {', '.join(map(repr, missing))}")
    wrong = [key for key in (*_DECISION_KEYS, "body") if not isinstance(record.get(key, ""), str)]
    if wrong:
        raise ValueError(f"{where}: a decision whose {', '.join(map(repr, wrong))} is not text")


def converted_ops_by_type(graph_def: Any, before: Any = None) -> collections.Counter:
    """Op types (not Casts) with a 16-bit type attr, over the main graph and the library;
    given the graph ``before`` the rewrite, only the nodes it did not already have so (a model
    built in float16, or under Keras's mixed policy, is not the rewrite's work)."""
    counts: collections.Counter = collections.Counter()
    earlier = _nodes_by_place(before) if before is not None else {}
    for place, node in _nodes_by_place(graph_def).items():
        if node.op == "Cast" or not _has_half_attr(node):
            continue
        if place in earlier and _has_half_attr(earlier[place]):
            continue
        counts[node.op] += 1
    return counts


def count_casts(graph_def: Any, before: Any = None) -> tuple[int, int]:
    """Casts float32 -> 16-bit and back, over every body; given the graph ``before`` the
    rewrite, only those it inserted or retargeted (the user's own Casts are not counted)."""
    from tensorflow.core.framework import types_pb2

    earlier = _nodes_by_place(before) if before is not None else {}
    to_half = to_float = 0
    for place, node in _nodes_by_place(graph_def).items():
        if node.op != "Cast":
            continue
        src, dst = node.attr["SrcT"].type, node.attr["DstT"].type
        old = earlier.get(place)
        if old is not None and old.op == "Cast" and (
            (old.attr["SrcT"].type, old.attr["DstT"].type) == (src, dst)
        ):
            continue
        if dst in _HALF and src == types_pb2.DT_FLOAT:
            to_half += 1
        elif src in _HALF and dst == types_pb2.DT_FLOAT:
            to_float += 1
    return to_half, to_float


def _has_half_attr(node: Any) -> bool:
    return any(
        attr.type in _HALF or any(t in _HALF for t in attr.list.type)
        for attr in node.attr.values()
    )


def _nodes_by_place(graph_def: Any) -> dict[tuple[str, str], Any]:
    """{(body, node name): node} over the main graph ("") and the library's functions."""
    return {(body, node.name): node for body, nodes in _bodies(graph_def) for node in nodes}


def float32_islands(decisions: list[dict[str, Any]], before: Any) -> list[list[dict[str, Any]]]:
    """Connected groups of float32 compute nodes (constants, feeds, variables left out).

    Connectivity comes from the graph before the rewrite; without it each node is its own
    island. Largest first. A node with one converted type attr is no island, whatever its
    other attrs hold (FusedBatchNormV3: ``T`` half, ``U`` float32 by its OpDef).
    """
    converted = {
        (d.get("body", ""), d["node"])
        for d in decisions
        if d.get("paint") == "allow" or d.get("dtype", "float32") != "float32"
    }
    kept = {
        (d.get("body", ""), d["node"]): d
        for d in decisions
        if (d.get("body", ""), d["node"]) not in converted
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
