"""``tf-amp``: rewrite graphs offline, inspect a log directory, show the effective op lists.

    tf-amp rewrite IN OUT [--target-dtype float16] [--opt-level O1] [--preserve a,b] ...
        IN is a GraphDef (.pb binary, .pbtxt/.txt text) or a SavedModel directory; OUT gets the
        same kind. Library functions (where a TF2 SavedModel keeps its bodies) are rewritten too.
    tf-amp inspect LOGDIR
        Per rewritten graph in a log directory (TF_AMP_LOG_PATH / RewriteConfig.log_dir): the
        summary line, ops converted by type, casts, and the float32 islands and why they stayed.
    tf-amp lists [--target-dtype float16] [--json]
        The allow / infer / clear / deny lists after the environment's overrides.
    tf-amp probe IN [--target-dtype float16] [--repeats 5]
        Times a GraphDef's allow/infer ops in float32 and in the target on this machine.

Every subcommand reads the environment through ``RewriteConfig.from_env`` (the one place that
does), so what it shows or does is what a training run in the same shell would do.

Modules: one per command (``rewrite_command``, ``inspect_command``, ``lists_command`` with
``probe``), ``saved_model`` (a SavedModel copied and rewritten), ``graph_files`` (GraphDef files).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from tf_amp.cli import inspect_command, lists_command, rewrite_command
from tf_amp.cli.graph_files import read_graph_def, write_graph_def
from tf_amp.cli.inspect_command import (
    converted_ops_by_type,
    count_casts,
    find_logged_graphs,
    float32_islands,
    format_graph_summary,
)
from tf_amp.cli.rewrite_command import rewrite_graph_def_file
from tf_amp.cli.saved_model import rewrite_saved_model

__all__ = [
    "converted_ops_by_type",
    "count_casts",
    "find_logged_graphs",
    "float32_islands",
    "format_graph_summary",
    "main",
    "read_graph_def",
    "rewrite_graph_def_file",
    "rewrite_saved_model",
    "write_graph_def",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tf-amp`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return int(args.handler(args) or 0)
    except (ValueError, OSError) as error:  # bad input, missing / wrong kind of path
        print(f"tf-amp {args.command}: error: {_in_words(error)}", file=sys.stderr)
        return 2


_PATH_ERRORS = {  # errno name -> what it means for a path given to tf-amp
    "EEXIST": "a file is in the way of a directory that must be made",
    "EISDIR": "is a directory; a file is expected (a SavedModel's directory goes to "
              "tf-amp rewrite)",
    "ENOTDIR": "a file is in the way of a directory in this path",
    "ENOENT": "no such file or directory",
    "EACCES": "permission denied",
}


def _in_words(error: Exception) -> str:
    """An OSError as the path it concerns and what is wrong with it, not ``[Errno 17] ...``."""
    if not isinstance(error, OSError) or error.filename is None or error.errno is None:
        return str(error)
    import errno

    meaning = _PATH_ERRORS.get(errno.errorcode.get(error.errno, ""), error.strerror)
    return f"{error.filename}: {meaning}"


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
    rewrite.set_defaults(handler=rewrite_command.run)

    inspect = sub.add_parser("inspect", help="summarise a rewrite log directory")
    inspect.add_argument("logdir")
    inspect.add_argument(
        "--islands", type=_count(0), default=5, help="float32 islands to show"
    )
    inspect.set_defaults(handler=inspect_command.run)

    lists = sub.add_parser("lists", help="show the effective op lists")
    lists.add_argument("--target-dtype", choices=("auto", "float16", "bfloat16"))
    lists.add_argument("--json", action="store_true", help="machine-readable output")
    lists.set_defaults(handler=lists_command.run_lists)

    probe = sub.add_parser(
        "probe", help="time a GraphDef's allow/infer ops in float32 and in the target here"
    )
    probe.add_argument("input", help="GraphDef file (.pb / .pbtxt)")
    probe.add_argument("--target-dtype", choices=("auto", "float16", "bfloat16"))
    probe.add_argument(
        "--repeats", type=_count(1), default=5, help="interleaved rounds per op"
    )
    probe.set_defaults(handler=lists_command.run_probe)
    return parser


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type for a whole number of at least ``minimum``.

    A plain ``int`` lets ``--repeats 0`` through to a median of nothing and ``--islands -1``
    through to a list slice that silently drops the last island; argparse's error names the
    flag instead.
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse
