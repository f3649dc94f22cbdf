"""The rewrite's log directory: what changed, in files a user (and TensorBoard) can open.

Files per rewrite (``<id>`` = process id and a per-process counter, ``<ms>`` = wall clock):

- ``graphdef_preop_<id>_<ms>.pb`` / ``.pbtxt``: the graph before;
- ``graphdef_AutoMixedPrecision_<id>_<ms>.pb`` / ``.pbtxt``: the graph after;
- ``paintbuckets_AutoMixedPrecision_<id>_<ms>.txt``: the lists used and the vertices per paint;
- ``decisions_AutoMixedPrecision_<id>_<ms>.jsonl``: one JSON object per float32 vertex
  (colour, list, pass, neighbour, reason in words) plus a first summary line;
- ``tensorboard/<id>_<ms>/{before,after}/events.out.tfevents.*``: both graphs as TensorBoard
  runs, with the ``_class`` colocation attrs stripped: placement hints a viewer does not need,
  which in TensorFlow's own dumps can name nodes the copy lacks (TensorBoard 2.21 draws such a
  graph anyway, checked by scripts/check_tensorboard_graphs.py; other viewers may not).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

from google.protobuf import text_format
from tensorflow.core.framework import graph_pb2

from tf_amp.report import RewriteReport

_COUNTER = itertools.count()


def strip_colocation(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """A copy without ``_class`` attrs (main graph and library functions)."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if "_class" in node.attr:
            del node.attr["_class"]
    for fdef in out.library.function:
        for node in fdef.node_def:
            if "_class" in node.attr:
                del node.attr["_class"]
    return out


def write_event_graph(run_dir: str, graph_def: graph_pb2.GraphDef) -> str:
    """Write ``graph_def`` as the graph of a TensorBoard run; returns the event file path."""
    from tensorflow.core.util import event_pb2

    from tf_amp._upstream.tensorflow import _pywrap_events_writer

    os.makedirs(run_dir, exist_ok=True)
    writer = _pywrap_events_writer.EventsWriter(os.path.join(run_dir, "events").encode())
    event = event_pb2.Event(wall_time=time.time(), step=0)
    event.graph_def = strip_colocation(graph_def).SerializeToString(deterministic=True)
    writer.WriteEvent(event)
    writer.Flush()
    path = writer.FileName()
    writer.Close()
    return path.decode() if isinstance(path, bytes) else str(path)


def write_rewrite_logs(
    log_dir: str, before: graph_pb2.GraphDef, after: graph_pb2.GraphDef, report: RewriteReport
) -> dict[str, str]:
    """Write every log file; returns {kind: path}.

    Raises ``OSError`` naming the log directory and where it is set when it cannot be
    written: the bare error (``[Errno 2] No such file or directory: '/proc/x'``) would
    surface from deep inside a training step without saying that a log path caused it.
    """
    try:
        return _write_rewrite_logs(log_dir, before, after, report)
    except OSError as error:
        message = (
            f"cannot write tf_amp's rewrite logs to {log_dir!r} (RewriteConfig.log_dir, from "
            "TF_AMP_LOG_PATH or TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH when set, or "
            f"tf-amp rewrite --log-dir): {error.strerror or error}; point it at a writable "
            "directory, or unset it"
        )
        # The same class and errno (FileNotFoundError, PermissionError...) for callers that
        # tell them apart; only the words are added to.
        if error.errno is None:
            raise OSError(message) from error
        raise type(error)(error.errno, message) from error


def _write_rewrite_logs(
    log_dir: str, before: graph_pb2.GraphDef, after: graph_pb2.GraphDef, report: RewriteReport
) -> dict[str, str]:
    os.makedirs(log_dir, exist_ok=True)
    stamp = f"{os.getpid()}_{next(_COUNTER)}_{int(time.time() * 1000)}"
    paths: dict[str, str] = {}

    def put(kind: str, name: str, data: Any, binary: bool = False) -> None:
        path = os.path.join(log_dir, name)
        with open(path, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            f.write(data)
        paths[kind] = path

    put("preop_pb", f"graphdef_preop_{stamp}.pb", before.SerializeToString(deterministic=True),
        binary=True)
    put("preop_pbtxt", f"graphdef_preop_{stamp}.pbtxt", text_format.MessageToString(before))
    put(
        "after_pb",
        f"graphdef_AutoMixedPrecision_{stamp}.pb",
        after.SerializeToString(deterministic=True),
        binary=True,
    )
    put(
        "after_pbtxt",
        f"graphdef_AutoMixedPrecision_{stamp}.pbtxt",
        text_format.MessageToString(after),
    )
    buckets = report.paint_buckets()
    lines = [report.summary_line(), ""]
    for paint in ("allow", "deny", "none"):
        lines.append(f"{paint.upper()} ({len(buckets[paint])}):")
        lines.extend(f"  {entry}" for entry in buckets[paint])
    # the lists in force, as TensorFlow's paintbuckets file shows them
    for name, ops in report.lists_used.items():
        lines.append("")
        lines.append(f"{name.capitalize()}List:")
        lines.extend(ops)
    put("paintbuckets", f"paintbuckets_AutoMixedPrecision_{stamp}.txt", "\n".join(lines) + "\n")
    head = {
        "graph_name": report.graph_name,  # which function: many share one log directory
        "summary": report.summary_line(),
        "target_dtype": report.target_dtype,
        "target_reason": report.target_reason,
        "type_attrs_converted": report.type_attrs_converted,
        "nodes_before": report.nodes_before,
        "casts_to_half": report.casts_to_half,
        "casts_to_float": report.casts_to_float,
        "pass_counts": report.pass_counts,
        # A converted node whose name was kept for its readers (tf_amp.Session keeps the
        # original names) is a Cast in the after-graph; its converted op is renamed to this.
        "renamed": report.renamed,
    }
    records = [json.dumps(head, sort_keys=True)]
    for decision in report.decisions:
        record = decision.as_dict()
        if not decision.body and decision.node in report.renamed:
            record["node_after"] = report.renamed[decision.node]
        records.append(json.dumps(record, sort_keys=True))
    put("decisions", f"decisions_AutoMixedPrecision_{stamp}.jsonl", "\n".join(records) + "\n")
    board = os.path.join(log_dir, "tensorboard", stamp)
    paths["events_before"] = write_event_graph(os.path.join(board, "before"), before)
    paths["events_after"] = write_event_graph(os.path.join(board, "after"), after)
    return paths
