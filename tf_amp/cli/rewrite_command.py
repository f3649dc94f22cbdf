"""``tf-amp rewrite IN OUT``: a GraphDef file or a SavedModel directory, rewritten."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from tf_amp.cli.graph_files import check_preserved, read_graph_def, write_graph_def
from tf_amp.cli.saved_model import rewrite_saved_model


def config_from_env(target_dtype: str | None, **overrides: Any) -> Any:
    """``RewriteConfig.from_env`` with ``--target-dtype`` (and ``overrides``) on top.

    A target forced by the flag gets a reason that names the flag: the config's own wording
    names ``TF_AMP_TARGET_DTYPE or target_dtype``, neither of which the user typed.
    """
    from tf_amp import hardware
    from tf_amp.config import RewriteConfig

    if target_dtype:
        overrides["target_dtype"] = target_dtype
    config = RewriteConfig.from_env(**overrides)
    if target_dtype and target_dtype != "auto":
        auto = hardware.choose_target(config.default_device_type)
        choice = hardware.forced_target(target_dtype, auto, asked_by="--target-dtype")
        config = config.replace(target_reason=choice.reason)
    return config


def _config_from_args(args: argparse.Namespace) -> Any:
    """The environment's config with the command line's options on top."""
    overrides: dict[str, Any] = {}
    if args.opt_level:
        overrides["opt_level"] = args.opt_level
    if args.devices:
        overrides["eligible_devices"] = args.devices
    if args.preserve:
        overrides["preserve_nodes"] = frozenset(split_names(args.preserve))
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
    return config_from_env(args.target_dtype, **overrides)


def run(args: argparse.Namespace) -> int:
    """``tf-amp rewrite``: prints the target and the summary line per graph.

    Those lines are the command's output, on stdout; the ``tf_amp`` logger's copies of them
    (the "Converted ..." and "graph left unchanged" records) are held back meanwhile, so each
    is printed once. The logger's other records (warnings, the probe's) still go to stderr.
    """
    config = _config_from_args(args)
    logger = logging.getLogger("tf_amp")
    logger.addFilter(_not_a_report_line)
    try:
        reports = _rewrite(args, config)
    finally:
        logger.removeFilter(_not_a_report_line)
    _say_unmatched_scopes(config.exclude_scopes, reports)
    if reports:
        print(f"target: {reports[0].target_dtype} ({reports[0].target_reason})")
    for i, report in enumerate(reports):
        where = f"MetaGraph {i}: " if len(reports) > 1 else ""
        line = report.summary_line() if report.changed else "nothing to do (graph unchanged)"
        print(where + line)
    print(f"wrote {args.output}")
    return 0


def _say_unmatched_scopes(scopes: tuple[str, ...], reports: list[Any]) -> None:
    """Names each ``--exclude-scope`` that no node of any graph or function is under: a
    mistyped scope (``dense_1`` for ``functional_1/dense_1``) kept nothing float32, silently,
    where a mistyped ``--preserve`` name is an error."""
    names = [name for report in reports for body in report.bodies for name in body.view.names]
    if not names:  # nothing was painted (a float32 target, O0): nothing to match
        return
    for scope in scopes:
        bare = scope.rstrip("/")
        if bare and not any(n == bare or n.startswith(bare + "/") for n in names):
            print(f"--exclude-scope {scope} matches no node: nothing is kept float32 for it "
                  "(a scope is the node name's whole leading part, as in 'model/dense_1')",
                  file=sys.stderr)


def _rewrite(args: argparse.Namespace, config: Any) -> list[Any]:
    """IN rewritten to OUT (a SavedModel directory or a GraphDef file); the reports."""
    if os.path.isdir(args.input):
        return list(rewrite_saved_model(args.input, args.output, config))
    if os.path.isdir(args.output):
        raise IsADirectoryError(f"OUT {args.output} is a directory; give a GraphDef file")
    both = os.path.exists(args.input) and os.path.exists(args.output)
    if both and os.path.samefile(args.input, args.output):
        raise ValueError("OUT must differ from IN (the GraphDef is copied, not edited)")
    return [rewrite_graph_def_file(args.input, args.output, config)]


def _not_a_report_line(record: logging.LogRecord) -> bool:
    """A logger filter: False for the records that restate a report (printed on stdout)."""
    from tf_amp.rewriter import REPORT_RECORD

    return not getattr(record, REPORT_RECORD, False)


def rewrite_graph_def_file(source: str, target: str, config: Any) -> Any:
    """Rewrites one GraphDef file; returns the report.

    A GraphDef names no fetches, so without ``--preserve`` its outputs (the nodes nothing
    reads: a frozen model's probabilities, say) are preserved: whoever runs the file fetches
    them by name and expects the dtype they had. A fetched node that another node reads too
    (logits read by a softmax) cannot be told from any other: the nodes whose dtype changed
    are named, with what to pass to keep them.
    """
    from tf_amp.rewriter import rewrite_graph_def

    graph_def = read_graph_def(source)
    guessed = not config.preserve_nodes and not config.preserve_names
    if not config.preserve_nodes:
        config = config.replace(preserve_nodes=_outputs(graph_def))
    else:
        check_preserved(graph_def, config.preserve_nodes, source)
    result = rewrite_graph_def(graph_def, config)
    write_graph_def(result.graph_def, target)
    if guessed and result.report.changed:
        _say_what_changed_dtype(graph_def, result.graph_def, config.preserve_nodes)
    return result.report


def _say_what_changed_dtype(before: Any, after: Any, kept: frozenset[str]) -> None:
    """Names the nodes whose type attributes changed, when the outputs were guessed."""

    def type_attrs(graph_def: Any) -> dict[str, dict[str, int]]:
        return {n.name: {k: v.type for k, v in n.attr.items() if v.type}
                for n in graph_def.node if n.op != "Const"}  # a folded constant is no output

    old, new = type_attrs(before), type_attrs(after)
    changed = sorted(name for name, types in old.items() if name in new and new[name] != types)
    if not changed:
        return
    shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
    print(
        f"kept float32: {len(kept)} output(s) nothing reads ({', '.join(sorted(kept)[:8])}); "
        f"{len(changed)} node(s) changed type ({shown}): fetch one of them, and it comes back "
        "in the target; --preserve NAME,... keeps the nodes you fetch, --preserve-names every "
        "tensor's dtype",
        file=sys.stderr,
    )


def _outputs(graph_def: Any) -> frozenset[str]:
    """Main-graph nodes that no node reads (through a data or a control input)."""
    read = {text.lstrip("^").split(":")[0] for node in graph_def.node for text in node.input}
    return frozenset(node.name for node in graph_def.node if node.name not in read)


def split_names(value: str) -> list[str]:
    """Comma-separated names; blanks ignored."""
    return [part.strip() for part in value.split(",") if part.strip()]
