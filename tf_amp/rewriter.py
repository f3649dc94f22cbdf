"""``rewrite_graph_def``: the public entry point of the mixed-precision graph rewrite.

A pure function: GraphDef (with its function library) in, a new GraphDef plus a report out.
The input is never mutated; the same input and config give the same bytes.

Example::

    from tf_amp.rewriter import rewrite_graph_def
    from tf_amp.config import RewriteConfig

    result = rewrite_graph_def(graph_def, RewriteConfig(preserve_nodes={"loss"}))
    print(result.report.summary_line())
    tf.graph_util.import_graph_def(result.graph_def)

Pipeline per body (main graph, then every library FunctionDef): ``type_attrs`` (vertex view)
-> ``painter`` (passes) -> ``cast_planner`` (attrs + casts), then ``report`` and, when a log
directory is configured, ``graph_log``.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from typing import Any

from tensorflow.core.framework import graph_pb2

import tf_amp.ops  # noqa: F401  (registers tf_amp's own op: a graph using it is not foreign)
from tf_amp._say_once import say_once
from tf_amp.cast_planner import plan_and_apply
from tf_amp.config import RewriteConfig
from tf_amp.painter import Painter
from tf_amp.painter.accumulator_guard import accumulator_guard_plan
from tf_amp.painter.eligibility import functions_called_from_excluded_nodes
from tf_amp.report import BodyRecord, RewriteReport
from tf_amp.type_attrs import (
    DT_BFLOAT16,
    DT_FLOAT,
    DT_HALF,
    GraphRewriteError,
    NodeColumns,
    OpInfo,
    build_body_view,
    function_op_info,
    read_node_columns,
)
from tf_amp.type_attrs.exclude import dataset_loop_bodies, input_pipeline_functions

logger = logging.getLogger("tf_amp")
# Set (True) on the records that restate a rewrite's report: what it converted, or that it
# left the graph unchanged. A caller that prints the report itself (``tf-amp rewrite`` on
# stdout) filters these out of the logger, so each line reaches the user once.
REPORT_RECORD = "tf_amp_report_line"
_AS_REPORT = {REPORT_RECORD: True}

__all__ = ["GraphRewriteError", "RewriteResult", "rewrite_graph_def"]


@dataclass(frozen=True)
class RewriteResult:
    """The rewritten graph and what was done to it."""

    graph_def: graph_pb2.GraphDef
    report: RewriteReport


def rewrite_graph_def(
    graph_def: graph_pb2.GraphDef,
    config: RewriteConfig | None = None,
    *,
    graph_name: str = "",
    built_by_tensorflow: bool = False,
) -> RewriteResult:
    """Rewrite ``graph_def`` for mixed precision; see the module docstring.

    ``graph_name`` only names the graph in log lines and the report: a GraphDef has no name of
    its own, and "nothing to do" is useless to a user who cannot tell which graph it is about.
    ``built_by_tensorflow``: the graph comes from TensorFlow's tracer or a Session (tf_amp's
    runtime), which cannot hold a cycle, so none is looked for: after Grappler's inlining its
    nodes are out of order, and the full check costs about 350 ms per 100k nodes.

    Raises:
      TypeError: ``graph_def`` is not a GraphDef.
      GraphRewriteError (a ValueError): the graph is malformed (duplicate node names,
        inputs naming no node, wrong input counts). Nothing is returned half-done.
    """
    config = config if config is not None else RewriteConfig()
    # The rewrite allocates millions of small lists on big graphs and frees them all at the
    # end; Python's cyclic GC would rescan them again and again (20x time for 10x nodes).
    # Nothing here creates reference cycles, so pausing it is safe and makes growth linear.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _rewrite(graph_def, config, graph_name, check_cycles=not built_by_tensorflow)
    finally:
        if gc_was_enabled:
            gc.enable()


def _probe(
    graph_def: graph_pb2.GraphDef, config: RewriteConfig, lists: Any, report: RewriteReport
) -> RewriteConfig:
    """Times the main graph's allow/infer ops (``tf_amp.probe``); the slow ones join
    ``slow_nodes``. A graph the probe cannot import is painted without it, and says so."""
    from tf_amp import probe

    categories = {op: lists.category(op) for op in {n.op for n in graph_def.node}}
    try:
        timings = probe.probe_graph(graph_def, config.target_dtype, categories)
    except (ValueError, TypeError) as err:
        logger.warning("probe skipped: the graph could not be timed op by op (%s)", err)
        return config
    # All at INFO when something was timed; when nothing was, the probe asked for did nothing,
    # and that is said where it is seen.
    level = logging.INFO if len(timings) else logging.WARNING
    if not len(timings):
        logger.warning("probe timed nothing: every op is painted by the lists alone")
    for untimed in timings.untimed:
        logger.log(level, "probe did not time %s", untimed.describe())
    report.probe_timings = timings
    return config.replace(slow_nodes=config.slow_nodes | probe.slow_nodes(timings))


def _rewrite(
    graph_def: graph_pb2.GraphDef,
    config: RewriteConfig,
    graph_name: str = "",
    check_cycles: bool = True,
) -> RewriteResult:
    out = _copy_graph_def(graph_def)
    if not isinstance(graph_def, graph_pb2.GraphDef):
        # From another protobuf runtime: everything below (logs, the probe) reads this one.
        graph_def = _copy_graph_def(graph_def)
    report = RewriteReport(
        target_dtype=config.target_dtype,
        graph_name=graph_name,
        target_reason=config.target_reason,
        opt_level=config.opt_level,
        check_kernels=config.check_kernels,
        default_device_type=config.default_device_type,
    )
    if config.opt_level == "O0":
        report.nodes_before = _nodes_in_bodies(out, config)
        logger.info("opt level O0, graph left unchanged (nothing to do)", extra=_AS_REPORT)
        return RewriteResult(out, report)
    if config.target_dtype == "float32":
        report.nodes_before = _nodes_in_bodies(out, config)
        say_once(  # every graph of a run has the same reason: a Session rewrites many
            ("float32 unchanged", config.target_reason),
            logging.INFO,
            "target float32, graph left unchanged: %s",
            config.target_reason,
            extra=_AS_REPORT,
        )
        return RewriteResult(out, report)

    target = DT_HALF if config.target_dtype == "float16" else DT_BFLOAT16
    lists = config.resolved_lists()
    report.lists_used = lists.as_dict()
    if config.probe:
        config = _probe(graph_def, config, lists, report)
    functions: dict[str, OpInfo] = {
        f.signature.name: function_op_info(f) for f in out.library.function
    }

    _warn_missing_preserved(out, config.preserve_nodes)
    bodies: list[tuple[str, Any, Any]] = [("", out, None)]
    if config.rewrite_functions:
        left_as_is = input_pipeline_functions(out)
        bodies.extend(
            (f.signature.name, f, f)
            for f in out.library.function
            if f.signature.name not in left_as_is
        )
    # Build every view first: a malformed body raises before any body is changed.
    views = []
    touched = False  # whether anything wrote into `out` (else it is still the input's copy)
    for name, container, fdef in bodies:
        nodes = fdef.node_def if fdef is not None else container.node
        columns = read_node_columns(nodes)
        touched |= _upgrade_batch_norms(columns, config.preserve_nodes if not name else frozenset())
        try:
            views.append(build_body_view(nodes, functions, fdef, columns, check_cycles))
        except GraphRewriteError as err:
            where = f" (in function {name!r})" if name else ""
            raise GraphRewriteError(f"{err}{where}") from None

    saved_gradient_types = frozenset(
        g.registered_op_type for g in out.library.registered_gradients
    )
    dataset_loops = dataset_loop_bodies(out)
    loop_bodies = _while_body_names(views) | dataset_loops.keys()
    for (name, _, _), view in zip(bodies, views, strict=True):
        view.saved_gradient_types = saved_gradient_types
        view.is_loop_body = name in loop_bodies
    if config.guards_accumulators:  # a loop's sum can reach into its conditions' branches
        running_sums = accumulator_guard_plan(
            {name: view for (name, _, _), view in zip(bodies, views, strict=True)},
            dataset_loops,
            frozenset(lists.allow),
        )
        for (name, _, _), view in zip(bodies, views, strict=True):
            view.running_sums = running_sums.get(name, frozenset())
    backward_of = {  # a tape's backward function names its forward one
        f.attr["forward_function_name"].s.decode(): f.signature.name
        for f in out.library.function
        if "forward_function_name" in f.attr
    }
    excluded_bodies = functions_called_from_excluded_nodes(
        [(name, view) for (name, _, _), view in zip(bodies, views, strict=True)], config,
        backward_of,
    )
    for (name, container, _fdef), view in zip(bodies, views, strict=False):
        preserve = config.preserve_nodes if not name else frozenset()
        slow = config.slow_nodes if not name else frozenset()
        painting = Painter(view, config, lists, preserve, slow, name in excluded_bodies).paint()
        report.nodes_before += view.num_real
        for n in view.unknown_ops:
            report.unknown_ops.append((name, view.names[n], view.ops[n]))
        for key, count in painting.pass_counts.items():
            report.pass_counts[key] = report.pass_counts.get(key, 0) + count
        record = BodyRecord(name, view, painting)
        report.bodies.append(record)
        if painting.nothing_to_do:
            continue
        report.nothing_to_do = False
        touched = True
        plan = plan_and_apply(
            view,
            painting,
            container,
            target,
            preserve_names=config.preserve_names,
            fold_constant_casts=config.fold_constant_casts,
        )
        report.type_attrs_converted += plan.type_attrs_converted
        report.casts_to_half += plan.casts_to_half
        report.casts_to_half_total += plan.casts_to_half_total
        report.casts_to_float += plan.casts_to_float
        report.consts_folded += plan.consts_folded
        record.folded = plan.folded_nodes
        report.renamed.update(plan.renamed)
        if name and plan.type_attrs_converted:
            report.functions_rewritten += 1

    if touched and not report.changed:
        out = _copy_graph_def(graph_def)  # "nothing to do" returns the input, byte for byte
    _log(report)
    if config.log_dir:
        from tf_amp.graph_log import write_rewrite_logs

        write_rewrite_logs(config.log_dir, graph_def, out, report)
    return RewriteResult(out, report)


def _while_body_names(views: list[Any]) -> frozenset[str]:
    """Names of the library functions some ``While`` / ``StatelessWhile`` runs as its body."""
    names = set()
    for view in views:
        for n in range(view.num_real):
            if view.ops[n] in ("While", "StatelessWhile"):
                body = view.protos[n].attr.get("body")
                if body is not None and body.func.name:
                    names.add(body.func.name)
    return frozenset(names)


def _warn_missing_preserved(graph_def: graph_pb2.GraphDef, preserve: frozenset[str]) -> None:
    """Says which ``preserve_nodes`` name no node of the main graph: a mistyped name protects
    nothing, and when it replaced the default (a graph's outputs) an output may turn half. A
    warning, not an error: one config serves many graphs (each traced function of a
    ``tf_amp.function``), and a name may belong to another of them."""
    if not preserve:
        return
    missing = frozenset(preserve.difference(node.name for node in graph_def.node))
    if missing:
        say_once(  # once: each trace of a function, each Session import
            ("preserve_nodes missing", missing),
            logging.WARNING,
            "preserve_nodes names %d node(s) the graph does not have, so nothing is kept for "
            "them: %s",
            len(missing),
            ", ".join(sorted(missing)[:10]) + (", ..." if len(missing) > 10 else ""),
        )


_BATCH_NORM_V2 = {
    "FusedBatchNorm": "FusedBatchNormV2",
    "FusedBatchNormGrad": "FusedBatchNormGradV2",
}


def _upgrade_batch_norms(columns: NodeColumns, preserve: frozenset[str]) -> bool:
    """FusedBatchNorm(Grad) V1 only allows float32 for T; V2 is the same op with a separate
    ``U`` for the statistics, so x/y can turn half while mean/variance stay float32 (what
    TensorFlow's pass does too). Preserved nodes keep their op.

    Works on the already-read op column, touching only the protos it changes: a sweep of
    its own over the NodeDefs cost 4% of the rewrite at 100k nodes and grew 13-18x per 10x.
    Returns whether it changed a node.
    """
    ops = columns.ops
    if _BATCH_NORM_V2.keys().isdisjoint(ops):
        return False
    changed = False
    for i, op in enumerate(ops):
        new_op = _BATCH_NORM_V2.get(op)
        if new_op is None or columns.names[i] in preserve:
            continue
        node = columns.protos[i]
        node.op = new_op
        node.attr["U"].type = DT_FLOAT
        ops[i] = new_op
        changed = True
    return changed


def _nodes_in_bodies(graph_def: graph_pb2.GraphDef, config: RewriteConfig) -> int:
    """The Y of "Converted X/Y nodes" when nothing is painted: the nodes of every body a
    rewrite would paint (the library's too, unless ``rewrite_functions`` is off), as counted
    when one is, so the same graph gives the same Y whatever the target."""
    functions = graph_def.library.function if config.rewrite_functions else ()
    left_as_is = input_pipeline_functions(graph_def) if functions else frozenset()
    return len(graph_def.node) + sum(
        len(f.node_def) for f in functions if f.signature.name not in left_as_is
    )


def _copy_graph_def(graph_def: Any) -> graph_pb2.GraphDef:
    if isinstance(graph_def, graph_pb2.GraphDef):
        out = graph_pb2.GraphDef()
        out.CopyFrom(graph_def)
        return out
    # Accept any GraphDef-like message (e.g. from another protobuf runtime) by bytes.
    if hasattr(graph_def, "SerializeToString") and type(graph_def).__name__ == "GraphDef":
        out = graph_pb2.GraphDef()
        out.ParseFromString(graph_def.SerializeToString())
        return out
    raise TypeError(
        f"rewrite_graph_def expects a tf.compat.v1.GraphDef, got {type(graph_def).__name__}; "
        f"use concrete_function.graph.as_graph_def() or graph.as_graph_def()"
    )


def _describe_graph(report: RewriteReport, shown: int = 3) -> str:
    """Which graph a log line is about: the caller's name for it when given (the runtime passes
    the ``tf.function``'s), its size, and its library functions, which carry the user's names
    too (``__inference_train_step_123``)."""
    main = report.bodies[0].view.num_real if report.bodies else report.nodes_before
    functions = [body.name for body in report.bodies if body.name]
    named = f"graph {report.graph_name!r}" if report.graph_name else "the graph"
    text = f"{named} of {main} node(s)"
    if functions:
        listed = ", ".join(functions[:shown])
        more = f", and {len(functions) - shown} more" if len(functions) > shown else ""
        text += f" and {len(functions)} function(s) ({listed}{more})"
    return text


def _log(report: RewriteReport) -> None:
    for key, count in sorted(report.pass_counts.items()):
        logger.debug("tf_amp pass %s changed %d vertices", key, count)
    if report.changed:
        logger.info(report.summary_line(), extra=_AS_REPORT)
    elif kept := report.allow_ops_kept():
        why = ", ".join(f"{count} {name}" for name, count in sorted(kept.items()))
        logger.info("all %d allow-list op(s) in %s kept float32 (%s), nothing to do (graph "
                    "unchanged)", sum(kept.values()), _describe_graph(report), why,
                    extra=_AS_REPORT)
    else:
        logger.info("no allow-list ops found in %s, nothing to do (graph unchanged)",
                    _describe_graph(report), extra=_AS_REPORT)
    if report.unknown_ops:
        shown = ", ".join(f"{node} ({op})" for _, node, op in report.unknown_ops[:5])
        logger.warning(
            "%d node(s) use ops TensorFlow has not registered and were kept float32: %s",
            len(report.unknown_ops),
            shown,
        )
