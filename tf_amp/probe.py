"""The probe: time each allow / infer op of a graph at its own shapes, in float32 and in the
target, on this machine, and keep float32 the ones that are not faster.

Why: a reduced-precision kernel that is *registered* is not always a *fast* one. On CPUs,
oneDNN runs some float16 ops with its reference kernels (a float16 Conv2DBackpropFilter ran
50-130x slower than float32 on a Xeon), and a small MatMul gains nothing from bfloat16 while
its casts still cost. The op lists cannot know this; a measurement on the machine can.

How: the graph is imported once to read every candidate op's input shapes (ops whose float
inputs have fully known shapes and whose other inputs are constants: a traced ``tf.function``
step has them; a GraphDef keeps the shapes of variable reads only with
``as_graph_def(add_shapes=True)``, which the runtime writes when the probe is on). Ops with
the same type, attributes and input shapes are timed once. Each is
rebuilt alone in a small graph, fed from variables (so nothing is constant-folded), once with
its float type attributes in float32 and once in the target, and the two are run in
interleaved rounds; the median time per run of each is kept.

Decision: an allow-list op stays float32 when its reduced kernel is not faster (it is there
only for speed); an infer or clear op only when its reduced kernel is much slower
(``INFER_SLOWDOWN``x), because keeping it float32 between reduced-precision neighbours costs a
cast pair, which an equal-speed elementwise kernel does not repay. Either kind must also lose
``MIN_LOSS_S`` per run: below that the two timings are noise. Times are net of the session's
own cost per run (a no-op's run time, measured in the same rounds), measured with TensorFlow's
own Session (never a rewriting one), and kept for the process: a signature is timed once.
Stateful ops (a Python function, a random op) are not run alone.

What cannot be timed is left out and listed (``ProbeTimings.untimed``), never an error: a
node whose op type this TensorFlow has not registered (a custom op whose library is not
loaded, directly or inside a library function it calls) cannot be imported, so it and the
nodes that read it (their input types and shapes are unknown without its OpDef) are dropped
from the copy the probe imports; a signature whose op cannot be rebuilt or run in float32 or
the target is skipped. The rewrite keeps such ops float32 for its own reasons (unregistered
ops) or paints the rest by the lists, as without the probe. Only a graph TensorFlow cannot
import even then (duplicate names, dangling inputs) is a ValueError.

Used by ``RewriteConfig(probe=True)`` / ``TF_AMP_PROBE=1`` (the rewrite probes the graph it is
given) and ``tf-amp probe GRAPH`` (prints the table).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, types_pb2

import tf_amp.ops  # noqa: F401  (registers tf_amp's own op: a graph using it is not foreign)
from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp._upstream.tensorflow import op_def_registry, tensor_util
from tf_amp.painter.kernel_support import kernel_takes
from tf_amp.type_attrs.exclude import CALL_OPS
from tf_amp.type_attrs.op_info import function_attr_names, node_layout, registry_op_info

INFER_SLOWDOWN = 1.5  # an infer op stays float32 only when this many times slower...
MIN_LOSS_S = 20e-6  # ...and any op only when slower by this much per run (else it is noise)
_DTYPES = {"float16": types_pb2.DT_HALF, "bfloat16": types_pb2.DT_BFLOAT16}
# Attributes that say where or how a node was built, not what it computes.
_IGNORED_ATTRS = frozenset({"_class", "_output_shapes", "_tf_amp_exclude", "_XlaCompile"})

# (signature, dtype name) -> seconds per run: replaces the measurement (tests, replays).
Timer = Callable[["Signature", str], float]

# (signature, target) -> (float32, target) seconds, measured once per process: a graph that
# grows (each new op of a ``tf_amp.Session``'s graph rewrites it again) re-times only what is
# new, and one op gets one decision in every graph of the process, not one per noisy probe.
# Kept with the repeats it was measured with: a probe asking for more measures again (a
# 5-repeat figure answered a 20-repeat probe, which then said nothing new).
_MEASURED: dict[tuple[Signature, str], tuple[float, float, int]] = {}


@dataclass(frozen=True)
class Signature:
    """What an op computes, up to its float type: op type, input shapes, other attrs."""

    op: str
    shapes: tuple[tuple[int, ...], ...]  # of the float inputs, in input order
    key: bytes  # attrs (float types left out) and constant inputs, serialised
    # What ``key`` holds, for people: two signatures that ``describe`` alike differ here.
    details: str = field(default="", compare=False)

    def describe(self) -> str:
        return f"{self.op}{list(map(list, self.shapes))}"


@dataclass(frozen=True)
class OpTiming:
    """One timed signature and the nodes that share it."""

    signature: Signature
    nodes: tuple[str, ...]
    float32_s: float
    reduced_s: float
    category: str  # "allow" / "infer"

    @property
    def ratio(self) -> float:
        """Reduced-precision time over float32 time (below 1: reduced is faster)."""
        return self.reduced_s / self.float32_s if self.float32_s > 0 else float("inf")

    @property
    def keep_float32(self) -> bool:
        # Either kind must lose a measurable time: below it the two timings are noise on a
        # busy machine, and a tiny MatMul flipped from one probe to the next.
        if self.reduced_s - self.float32_s < MIN_LOSS_S:
            return False
        return self.ratio >= (1.0 if self.category == "allow" else INFER_SLOWDOWN)


@dataclass(frozen=True)
class Untimed:
    """Nodes the probe left out, and why in words (the rewrite paints them unmeasured)."""

    nodes: tuple[str, ...]
    why: str

    def describe(self, shown: int = 5) -> str:
        names = ", ".join(self.nodes[:shown])
        more = f" and {len(self.nodes) - shown} more" if len(self.nodes) > shown else ""
        return f"{len(self.nodes)} node(s) ({names}{more}): {self.why}"


class ProbeTimings(list):
    """``probe_graph``'s answer: the ``OpTiming`` list, and in ``untimed`` what it left out.

    A list, so callers that only want the timings use it as one; the untimed nodes ride along
    for the callers that say what the probe could not judge (``tf-amp probe``, the rewrite's
    log).
    """

    def __init__(
        self, timings: Iterable[OpTiming] = (), untimed: Iterable[Untimed] = ()
    ) -> None:
        super().__init__(timings)
        self.untimed: list[Untimed] = list(untimed)


@dataclass
class _Candidate:
    op: tf.Operation
    signature: Signature
    float_inputs: list[int]  # input positions fed from variables
    constants: dict[int, np.ndarray]  # the other inputs' values


def probe_graph(
    graph_def: graph_pb2.GraphDef,
    target_dtype: str,
    categories: dict[str, str],
    repeats: int = 5,
    timer: Timer | None = None,
) -> ProbeTimings:
    """Times every op of ``graph_def``'s main graph whose type ``categories`` maps to "allow"
    or "infer", once per signature. Ops whose shapes are not all known, and function calls,
    are listed in ``untimed`` with the reason. (Clear
    ops move data; they cost about as much in any float type and time at the noise level.)
    What could not be timed is in the answer's ``untimed`` (see the module docstring).

    Raises ValueError when TensorFlow cannot import the graph without its unregistered ops."""
    if target_dtype not in _DTYPES:
        raise ValueError(f"the probe times float16 or bfloat16, not {target_dtype!r}")
    importable, untimed = _without_unregistered(graph_def, categories)
    graph = tf.Graph()
    with graph.as_default():
        try:
            tf.graph_util.import_graph_def(importable, name="")
        except (ValueError, tf.errors.OpError) as error:
            message = error.message if isinstance(error, tf.errors.OpError) else error
            raise ValueError(f"TensorFlow cannot import the graph: {message}") from None
    groups: dict[Signature, list[_Candidate]] = {}
    skipped: dict[str, list[str]] = {}  # why -> node names: listed, not dropped in silence
    functions = {f.signature.name for f in importable.library.function}
    for op in graph.get_operations():
        if categories.get(op.type) in ("allow", "infer"):
            candidate = _candidate(op)
            if isinstance(candidate, str):
                skipped.setdefault(candidate, []).append(op.name)
            elif candidate is not None:
                groups.setdefault(candidate.signature, []).append(candidate)
        elif op.type in functions or op.type in CALL_OPS:
            skipped.setdefault(_IN_A_FUNCTION, []).append(op.name)
    timings = ProbeTimings(untimed=untimed)
    timings.untimed += [Untimed(tuple(names), why) for why, names in skipped.items()]
    target_enum = tf.as_dtype(target_dtype).as_datatype_enum
    for signature, members in groups.items():
        names = tuple(c.op.name for c in members)
        turns = _attrs_that_turn(members[0].op.node_def, target_enum)
        if not turns:
            why = (f"{signature.describe()} has no {target_dtype} kernel on this machine: the "
                   "rewrite keeps it float32, nothing to time")
            timings.untimed.append(Untimed(names, why))
            continue
        if timer is not None:
            f32, reduced = timer(signature, "float32"), timer(signature, target_dtype)
        elif _MEASURED.get((signature, target_dtype), (0, 0, 0))[2] >= repeats:
            f32, reduced, _ = _MEASURED[signature, target_dtype]
        else:
            try:
                f32, reduced = _measure(members[0], target_dtype, turns, repeats)
                _MEASURED[signature, target_dtype] = f32, reduced, repeats
            except (ValueError, TypeError, tf.errors.OpError) as error:
                # No kernel for a type, an OpDef that does not allow it: this op is left to
                # the lists (and the rewrite's kernel check); the others are still timed.
                message = error.message if isinstance(error, tf.errors.OpError) else error
                why = f"{signature.describe()} could not be run alone: {_first_line(message)}"
                timings.untimed.append(Untimed(names, why))
                continue
        timings.append(OpTiming(signature, names, f32, reduced, categories[signature.op]))
    return timings


def slow_nodes(timings: Iterable[OpTiming]) -> frozenset[str]:
    """Names of the nodes the probe keeps float32."""
    return frozenset(name for t in timings if t.keep_float32 for name in t.nodes)


def _without_unregistered(
    graph_def: graph_pb2.GraphDef, categories: dict[str, str]
) -> tuple[graph_pb2.GraphDef, list[Untimed]]:
    """``graph_def`` without the main-graph nodes TensorFlow cannot import here, and the
    ``Untimed`` entries that say which and why (the input itself when all import).

    Dropped: nodes whose op type is not registered (or is a library function that uses one,
    at any depth, or that names such a function in an attribute), and the nodes that read
    their outputs, at any distance. Of the readers only the allow/infer ones are listed: they
    are the ones the probe would have timed. Control inputs on a dropped node are removed
    (they order, they carry no type or shape), and so are the library functions that use
    unregistered ops.
    """
    missing_in = _functions_with_unregistered_ops(graph_def.library)
    functions = {f.signature.name for f in graph_def.library.function}
    unknown = {
        op for op in {n.op for n in graph_def.node}
        if op not in functions and op_def_registry.get(op) is None
    }

    def unregistered(node: graph_pb2.NodeDef) -> set[str]:
        found = set(missing_in.get(node.op, ()))
        if node.op in unknown:
            found.add(node.op)
        for name in function_attr_names(node):
            found |= missing_in.get(name, set())
        return found

    by_types: dict[tuple[str, ...], list[str]] = {}
    dropped: set[str] = set()
    for node in graph_def.node:
        missing = unregistered(node)
        if missing:
            by_types.setdefault(tuple(sorted(missing)), []).append(node.name)
            dropped.add(node.name)
    if not dropped:
        return graph_def, []
    readers: dict[str, list[graph_pb2.NodeDef]] = {}
    for node in graph_def.node:
        for text in node.input:
            if not text.startswith("^"):
                readers.setdefault(text.split(":")[0], []).append(node)
    downstream: list[str] = []
    frontier = list(dropped)
    while frontier:
        for reader in readers.get(frontier.pop(), ()):
            if reader.name not in dropped:
                dropped.add(reader.name)
                frontier.append(reader.name)
                if categories.get(reader.op) in ("allow", "infer"):
                    downstream.append(reader.name)
    why = "uses op types this TensorFlow has not registered: "
    untimed = [Untimed(tuple(names), why + ", ".join(ops)) for ops, names in by_types.items()]
    if downstream:
        why = "read an unregistered op's output (at any distance): input types and shapes unknown"
        untimed.append(Untimed(tuple(downstream), why))
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    del out.library.function[:]
    out.library.function.extend(
        f for f in graph_def.library.function if f.signature.name not in missing_in
    )
    for node in graph_def.node:
        if node.name not in dropped:
            kept = out.node.add()
            kept.CopyFrom(node)
            kept.input[:] = [t for t in node.input if t.lstrip("^").split(":")[0] not in dropped]
    return out, untimed


def _functions_with_unregistered_ops(
    library: graph_pb2.FunctionDefLibrary,
) -> dict[str, set[str]]:
    """{function name: the unregistered op types it uses, through the functions it calls}, for
    the library functions that use any (importing a call to one fails)."""
    names = {f.signature.name for f in library.function}
    direct: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    for function in library.function:
        name = function.signature.name
        direct[name] = {
            n.op for n in function.node_def
            if n.op not in names and op_def_registry.get(n.op) is None
        }
        calls[name] = {n.op for n in function.node_def if n.op in names} | {
            f for n in function.node_def for f in function_attr_names(n) if f in names
        }
    missing = {name: set(ops) for name, ops in direct.items()}
    changed = True
    while changed:  # to a fixed point: a function calling one that uses an unregistered op
        changed = False
        for name, called in calls.items():
            for callee in called:
                if not missing[callee] <= missing[name]:
                    missing[name] |= missing[callee]
                    changed = True
    return {name: ops for name, ops in missing.items() if ops}


def _attrs_that_turn(node: Any, target: int) -> frozenset[str]:
    """The node's type attrs the rewrite may set to ``target``, asked as the rewrite asks
    (``tf_amp.painter.kernel_support``): the OpDef allows it, and a kernel on this machine's
    device takes it with the node's other attrs as they are (FusedBatchNormV3's OpDef allows a
    bfloat16 ``U``, its kernels only float32). Every attr, for an op TensorFlow does not know."""
    info = registry_op_info(node.op)
    names = [name for name in node.attr if name not in _IGNORED_ATTRS]
    if info is None:
        return frozenset(names)
    current: dict[str, Any] = {}
    for name in (*info.type_attrs, *info.list_type_attrs):
        if name in node.attr:
            value = node.attr[name]
            current[name] = tuple(value.list.type) if name in info.list_type_attrs else value.type
    dev = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    turns = []
    for name in names:
        allowed = info.allowed.get(name, ())
        if name not in current or not (allowed is None or target in allowed):
            continue
        value = current[name]
        turned = (tuple(target if t == types_pb2.DT_FLOAT else t for t in value)
                  if isinstance(value, tuple) else target)
        if kernel_takes(node.op, dev, {**current, name: turned}):
            turns.append(name)
    return frozenset(turns)


def _first_line(message: object) -> str:
    """The line of an error that says what went wrong: TensorFlow's run errors open with
    "Graph execution error:" and a "Detected at node" block, and end with it."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    if lines[0].endswith(":"):
        # Skip the header, the stack of where the node was made, its name, the [[node]] tail.
        said = [line for line in lines[1:] if not line.startswith(_WHERE_PREFIXES)]
        if said:
            return said[0]
    return lines[0]


_WHERE_PREFIXES = ("Detected at node", "File ", "Node:", "[[")


def _known_shape(tensor: tf.Tensor) -> tf.TensorShape:
    """The tensor's static shape, completed from its producer's ``_output_shapes`` attr (which
    ``as_graph_def(add_shapes=True)`` writes; a variable read's shape is lost otherwise)."""
    shape = tensor.shape
    if shape.is_fully_defined():
        return shape
    try:
        recorded = tensor.op.get_attr("_output_shapes")[tensor.value_index]
    except (ValueError, IndexError):
        return shape
    return shape.merge_with(tf.TensorShape(recorded)) if shape.is_compatible_with(
        tf.TensorShape(recorded)) else shape


_IN_A_FUNCTION = (
    "a function call: the probe times the main graph's own ops, and the ops inside library "
    "functions (all of a TF2 SavedModel's) are painted by the lists alone"
)
_UNKNOWN_SHAPE = (
    "an input shape is not fully known (an unknown batch size): give the graph fixed shapes "
    "to time it"
)


_STATEFUL = (
    "it is stateful (a Python function, a random op...): timed alone, its effects would run "
    "hundreds of times"
)


def _candidate(op: tf.Operation) -> _Candidate | str | None:
    """What to time for ``op``, or why it cannot be timed alone (None: nothing to time)."""
    if op.op_def.is_stateful:  # a py_function, a random op: run alone, its effects repeat
        return _STATEFUL
    float_inputs, constants, shapes = [], {}, []
    for i, tensor in enumerate(op.inputs):
        if tensor.dtype == tf.float32:
            shape = _known_shape(tensor)
            if not shape.is_fully_defined():
                return _UNKNOWN_SHAPE
            float_inputs.append(i)
            shapes.append(tuple(shape.as_list()))
        elif tensor.dtype == tf.resource:
            return "it reads a variable handle"
        else:
            value = _static_value(tensor)
            if value is None:
                return "a non-float input is not a constant"
            constants[i] = np.asarray(value)
    if not float_inputs:
        return None  # integer arithmetic (shapes, indices): nothing the rewrite would convert
    node = op.node_def
    attrs = sorted(
        (k, v.SerializeToString(deterministic=True))
        for k, v in node.attr.items()
        if k not in _IGNORED_ATTRS and v.type != types_pb2.DT_FLOAT
    )
    key = repr((attrs, [(i, v.tobytes(), v.shape) for i, v in sorted(constants.items())]))
    details = _details(node, attrs, constants)
    signature = Signature(op.type, tuple(shapes), key.encode(), details)
    return _Candidate(op, signature, float_inputs, constants)


def _details(node: Any, attrs: list[tuple[str, bytes]], constants: dict[int, np.ndarray]) -> str:
    """The attrs and constant inputs of a signature's key as ``name=value`` words (a
    constant of more than 8 elements by its shape): what tells apart two rows of
    ``tf-amp probe``'s table with the same op and input shapes."""
    words = [f"{name}={_attr_text(node.attr[name])}" for name, _ in attrs]
    for index, value in sorted(constants.items()):
        shown = value.tolist() if value.size <= 8 else f"<{value.dtype} {list(value.shape)}>"
        words.append(f"input{index}={shown}")
    return " ".join(words)


def _attr_text(value: attr_value_pb2.AttrValue) -> str:
    """One attr value as a short word: ``SAME``, ``True``, ``[1, 2, 2, 1]``, a type's name."""
    kind = value.WhichOneof("value")
    if kind == "list":
        items = [
            *value.list.s, *value.list.i, *value.list.f, *value.list.b,
            *(tf.dtypes.as_dtype(t).name for t in value.list.type),
        ]
        return "[" + ", ".join(_scalar_text(item) for item in items) + "]"
    if kind == "type":
        return tf.dtypes.as_dtype(value.type).name
    if kind in ("s", "i", "f", "b"):
        return _scalar_text(getattr(value, kind))
    return kind or "none"  # shape, tensor, func: rare on allow/infer ops, named by their kind


def _scalar_text(item: Any) -> str:
    return item.decode(errors="replace") if isinstance(item, bytes) else str(item)


def _static_value(tensor: tf.Tensor) -> np.ndarray | None:
    """A constant input's value; also the shape a Shape/ShapeN of a fully known tensor gives
    (the ``input_sizes`` / ``filter_sizes`` of a convolution's gradient)."""
    value = tensor_util.constant_value(tensor)
    if value is not None:
        return value
    producer = tensor.op
    if producer.type in ("Shape", "ShapeN"):
        source = producer.inputs[tensor.value_index if producer.type == "ShapeN" else 0]
        if source.shape.is_fully_defined():
            return np.asarray(source.shape.as_list(), tensor.dtype.as_numpy_dtype)
    return None


def _measure(
    candidate: _Candidate, target_dtype: str, turns: frozenset[str], repeats: int
) -> tuple[float, float]:
    """Median seconds per run of the op alone, in float32 and in the target (its type attrs
    ``turns`` set to it), interleaved."""
    graph = tf.Graph()
    runs: dict[str, list[float]] = {"float32": [], target_dtype: []}
    fetches = {}
    with graph.as_default():
        rng = np.random.default_rng(0)
        for dtype in runs:
            fetches[dtype] = _rebuild(candidate, dtype, turns, rng)
        init = tf.compat.v1.global_variables_initializer()
        fetches["overhead"] = tf.no_op()
    runs["overhead"] = []
    # TensorFlow's own Session: under TF_ENABLE_AUTO_MIXED_PRECISION the public name is
    # tf_amp's, which rewrote this graph (its float32 timing was a half one) and probed it
    # again, without end (RecursionError).
    with upstream_tf.Session(graph=graph) as session:
        session.run(init)
        for fetch in fetches.values():
            session.run(fetch)  # first run: kernel selection, allocations
        inner = _runs_per_sample(session, fetches["float32"])
        for _ in range(repeats):
            for dtype, fetch in fetches.items():
                start = time.perf_counter()
                for _ in range(inner):
                    session.run(fetch)
                runs[dtype].append((time.perf_counter() - start) / inner)
    overhead = statistics.median(runs["overhead"])
    f32, reduced = statistics.median(runs["float32"]), statistics.median(runs[target_dtype])
    return max(f32 - overhead, 1e-7), max(reduced - overhead, 1e-7)


def _runs_per_sample(session: Any, fetch: tf.Operation) -> int:
    """Enough runs per sample for about 20 ms, so tiny ops are not all timer noise."""
    start = time.perf_counter()
    session.run(fetch)
    once = max(time.perf_counter() - start, 1e-6)
    return int(min(50, max(1, 0.02 // once)))


def _rebuild(
    candidate: _Candidate, dtype: str, turns: frozenset[str], rng: np.random.Generator
) -> tf.Operation:
    """The candidate's op alone in the default graph, as the rewrite would leave it in
    ``dtype``: its float32 type attrs in ``turns`` (:func:`_attrs_that_turn`) set to it, and the
    inputs they govern in ``dtype``; an attr that does not turn (``FusedBatchNormV3``'s ``U``,
    its statistics) stays float32, with its inputs. For float32 nothing changes."""
    target = tf.as_dtype(dtype)
    node = candidate.op.node_def
    info = registry_op_info(node.op)
    ports = node_layout(info.in_args, node, info) if info is not None else ()
    inputs = []
    for i, tensor in enumerate(candidate.op.inputs):
        if i in candidate.constants:
            inputs.append(tf.constant(candidate.constants[i]))
            continue
        governed_by = ports[i][0] if i < len(ports) else None
        in_dtype = target if governed_by is None or governed_by in turns else tf.float32
        value = rng.standard_normal(_known_shape(tensor).as_list()).astype(np.float32) * 0.1
        variable = tf.Variable(tf.cast(value, in_dtype))
        inputs.append(variable.read_value())
    attrs = {}
    for name, value in node.attr.items():
        if name in _IGNORED_ATTRS:
            continue
        copy = attr_value_pb2.AttrValue()
        copy.CopyFrom(value)
        if name in turns and copy.type == types_pb2.DT_FLOAT:
            copy.type = target.as_datatype_enum
        elif name in turns and copy.list.type:
            copy.list.type[:] = [
                target.as_datatype_enum if t == types_pb2.DT_FLOAT else t for t in copy.list.type
            ]
        attrs[name] = copy
    graph = tf.compat.v1.get_default_graph()
    op = graph.create_op(candidate.op.type, inputs, attrs=attrs, name=f"probe_{dtype}")
    return op
