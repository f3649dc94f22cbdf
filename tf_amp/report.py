"""The rewrite report: counts, TensorFlow's summary line, and a per-vertex decision in words.

Why words: TensorFlow's pass explains itself only through VLOG(2) lines that name internal
sets. A user asking "why is my LayerNorm still float32?" should get an answer like "fed by
float32-only op 'Exp' through clear/infer ops, and feeds a deny/infer op", with the pass that
decided it. Decisions are built lazily (a 1M-node rewrite should not pay for strings nobody
reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tf_amp.painter import ALLOW_C, CAT_ALLOW, CAT_CLEAR, CAT_DENY, CAT_INFER, DENY_C, Painting
from tf_amp.painter.reasons import (
    R_ALLOW_LIST,
    R_BETWEEN_ALLOW,
    R_CAST_RETARGET,
    R_CLEAR_PROPAGATED,
    R_DENY_LIST,
    R_DENY_PROPAGATED,
    R_FOLLOWS_ALLOW,
    R_FORCED_LEVEL,
    R_NO_HALF_SUPPORT,
    R_RECURRENT_PAINT,
    R_RECURRENT_UNPAINT,
    R_TENSOR_LIST_MATCH_ALLOW,
    R_TENSOR_LIST_MATCH_DENY,
    R_TENSOR_LIST_UNSAFE,
)
from tf_amp.type_attrs import BodyView, device_type

_CAT_WORD = {CAT_ALLOW: "allow", CAT_INFER: "infer", CAT_CLEAR: "clear", CAT_DENY: "deny"}
# Why a vertex got its colour, in a user's words, per painter reason code. Fields: op, t (the
# target dtype), cause (the neighbour that decided it), by (" (cause)" or ""), op_list, level.
_REASON_TEXT: dict[int, str] = {
    R_ALLOW_LIST: "{op} is on the allow list: performance-critical and safe in {t}",
    R_FORCED_LEVEL: "opt level {level} converts every op that has a {t} kernel",
    R_BETWEEN_ALLOW: (
        "{op_list} op lying between {t} ops (downstream and upstream of one, here {cause}): "
        "converting it saves a pair of casts"
    ),
    R_FOLLOWS_ALLOW: "infer op fed directly by {t} op {cause} (infer_follows_allow)",
    R_CLEAR_PROPAGATED: "clear op (moves data, no numeric effect) connected to {t} op {cause}",
    R_TENSOR_LIST_MATCH_ALLOW: (
        "TensorList sharing a handle with {t} list op {cause}: one element type"
    ),
    R_RECURRENT_PAINT: "loop back edge: matches the colour of its Merge {cause}",
    R_CAST_RETARGET: "existing Cast whose consumers are all {t}: now casts to {t} directly",
    R_DENY_LIST: "{op} is on the deny list: numerically unsafe in {t}, kept float32",
    R_DENY_PROPAGATED: (
        "fed (through clear/infer ops) by float32-only op {cause} and itself feeds a "
        "deny/infer op: kept float32 so the unsafe value is not rounded"
    ),
    R_TENSOR_LIST_UNSAFE: (
        "TensorList whose handle crosses a function, feed or control-flow boundary: "
        "the other side cannot be changed consistently, kept float32"
    ),
    R_TENSOR_LIST_MATCH_DENY: (
        "TensorList sharing a handle with float32 list op {cause}: one element type"
    ),
    R_NO_HALF_SUPPORT: "no {t} support (OpDef or kernel) for this attr: kept float32",
    R_RECURRENT_UNPAINT: "loop-carried value: a Merge/NextIteration partner{by} is float32",
}

# Why a node was never a candidate (the painter's node_block), in a user's words.
_BLOCK_TEXT: dict[str, str] = {
    "unknown-op": "op {op} is not registered with TensorFlow: kept float32, casts at its edges",
    "preserved": "node is preserved (feed/fetch): its dtype must not change",
    "state": "constant, feed or variable access: keeps its dtype (master weights)",
    "dtype-bound": "op {op} computes with its dtype itself (bits, bytes, Python code, "
    "counting), not just at a precision: kept float32 at every level",
    "function": "calls a function; its signature stays float32 (the body is rewritten)",
    "excluded": "excluded by exclude_scopes or the _tf_amp_exclude attr: kept float32",
    "float32-view": "the float32 view an earlier name-preserving rewrite left under the old "
    "name of an op it turned half: kept float32",
    "device": "not placed on a GPU (eligible_devices='gpu'): not processed",
    "measured-slow": "op {op} measured slower in the target than in float32 at its shapes on "
    "this machine (tf_amp.probe): kept float32",
}

_PASS = {
    R_ALLOW_LIST: "add_allow_list_ops",
    R_FORCED_LEVEL: "add_allow_list_ops",
    R_DENY_LIST: "propagate_deny_forward",
    R_DENY_PROPAGATED: "propagate_deny_forward",
    R_TENSOR_LIST_UNSAFE: "find_tensor_list_clusters",
    R_TENSOR_LIST_MATCH_ALLOW: "force_tensor_list_colour_match",
    R_TENSOR_LIST_MATCH_DENY: "force_tensor_list_colour_match",
    R_BETWEEN_ALLOW: "add_clear_and_infer_between_allow",
    R_CLEAR_PROPAGATED: "propagate_allow_through_clear",
    R_NO_HALF_SUPPORT: "remove_allow_without_half",
    R_RECURRENT_UNPAINT: "force_recurrent_edge_colour_match",
    R_RECURRENT_PAINT: "force_recurrent_edge_colour_match",
    R_CAST_RETARGET: "retarget_casts_to_half",
    R_FOLLOWS_ALLOW: "add_infer_following_allow",
}


@dataclass(frozen=True)
class VertexDecision:
    """The final colour of one float32 (node, type attr) vertex and why."""

    body: str  # "" for the main graph, else the library function's name
    node: str
    op: str
    attr: str  # "T", "SrcT", "T[2]" (list element)
    dtype: str  # final dtype: "float16" / "bfloat16" / "float32"
    paint: str  # "allow" / "deny" / "none"
    op_list: str | None  # which list the op is on
    pass_name: str | None  # which pass decided it (None: never painted)
    cause: str | None  # the neighbour vertex that caused it
    reason: str  # in words

    def as_dict(self) -> dict[str, Any]:
        return {
            "body": self.body,
            "node": self.node,
            "op": self.op,
            "attr": self.attr,
            "dtype": self.dtype,
            "paint": self.paint,
            "list": self.op_list,
            "pass": self.pass_name,
            "cause": self.cause,
            "reason": self.reason,
        }


@dataclass
class BodyRecord:
    """One rewritten body (kept so decisions can be rendered on demand)."""

    name: str
    view: BodyView
    painting: Painting
    folded: frozenset[int] = frozenset()  # Const nodes the planner turned half in place


@dataclass
class RewriteReport:
    """Counts and decisions of one ``rewrite_graph_def`` call (all bodies together)."""

    target_dtype: str = "float16"
    graph_name: str = ""  # what the caller calls the graph (a tf.function's name), for logs
    target_reason: str = ""  # why this target (tf_amp.hardware), in words
    opt_level: str = "O1"
    # Counts cover every rewritten body: the main graph plus each library function (TensorFlow
    # prints one line per function instead; the sum is what a user of the whole graph wants).
    type_attrs_converted: int = 0
    nodes_before: int = 0
    casts_to_half: int = 0  # excluding casts fed by a Const or a variable read (TF's count)
    casts_to_half_total: int = 0
    casts_to_float: int = 0
    consts_folded: int = 0
    functions_rewritten: int = 0
    pass_counts: dict[str, int] = field(default_factory=dict)
    unknown_ops: list[tuple[str, str, str]] = field(default_factory=list)  # (body, node, op)
    renamed: dict[str, str] = field(default_factory=dict)
    nothing_to_do: bool = True
    bodies: list[BodyRecord] = field(default_factory=list, repr=False)
    check_kernels: bool = True
    default_device_type: str = "CPU"
    probe_timings: list[Any] = field(default_factory=list, repr=False)  # tf_amp.probe.OpTiming
    lists_used: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _decisions: list[VertexDecision] | None = field(default=None, repr=False)
    _index: dict[tuple[str, str, str], VertexDecision] | None = field(default=None, repr=False)

    @property
    def changed(self) -> bool:
        return self.type_attrs_converted > 0

    def summary_line(self) -> str:
        """TensorFlow's log line, word for word."""
        t = self.target_dtype
        return (
            f"Converted {self.type_attrs_converted}/{self.nodes_before} nodes to {t} precision "
            f"using {self.casts_to_half} cast(s) to {t} (excluding Const and Variable casts)"
        )

    @property
    def decisions(self) -> list[VertexDecision]:
        """One decision per float32 vertex of every body, in graph order."""
        if self._decisions is None:
            out: list[VertexDecision] = []
            for body in self.bodies:
                for v in range(body.view.num_vertices):
                    out.append(self._decide(body, v))
            self._decisions = out
        return self._decisions

    def decision_for(self, node: str, attr: str = "T", body: str = "") -> VertexDecision:
        """The decision for one vertex (KeyError if it is not a float32 vertex)."""
        if self._index is None:
            self._index = {(d.body, d.node, d.attr): d for d in self.decisions}
        try:
            return self._index[(body, node, attr)]
        except KeyError:
            raise KeyError(f"no float32 vertex {node!r} {attr!r} in body {body!r}") from None

    def colours(self, body: str = "") -> dict[tuple[str, str], str]:
        """{(node, attr): "allow" | "float32"} for one body (handy in tests)."""
        return {
            (d.node, d.attr): ("allow" if d.dtype != "float32" else "float32")
            for d in self.decisions
            if d.body == body
        }

    def paint_buckets(self) -> dict[str, list[str]]:
        """Vertices grouped by final paint, like TensorFlow's paintbuckets file."""
        buckets: dict[str, list[str]] = {"allow": [], "deny": [], "none": []}
        for d in self.decisions:
            prefix = f"{d.body}::" if d.body else ""
            buckets[d.paint].append(f"{prefix}{d.node} ({d.op}) {d.attr}")
        return buckets

    # ------------------------------------------------------------------ words
    def _decide(self, body: BodyRecord, v: int) -> VertexDecision:
        view, painting = body.view, body.painting
        n = view.v_node[v]
        op = view.ops[n]
        elem = view.v_elem[v]
        attr = view.v_attr[v] if elem < 0 else f"{view.v_attr[v]}[{elem}]"
        colour = painting.colour[v]
        code = painting.reason[v]
        cause_v = painting.cause[v]
        cause = view.vertex_label(cause_v) if cause_v >= 0 else None
        op_list = _CAT_WORD.get(painting.cat[v])
        t = self.target_dtype
        paint = "allow" if colour == ALLOW_C else "deny" if colour == DENY_C else "none"
        dtype = t if colour == ALLOW_C else "float32"
        reason = self._words(view, painting, v, code, cause, op, op_list)
        if n in body.folded:
            dtype = t
            reason = (
                f"constant read only by {t} ops: folded into a {t} constant in place "
                "(fold_constant_casts), so no Cast is needed"
            )
        return VertexDecision(
            body=body.name,
            node=view.names[n],
            op=op,
            attr=attr,
            dtype=dtype,
            paint=paint,
            op_list=op_list,
            pass_name=_PASS.get(code),
            cause=cause,
            reason=reason,
        )

    def _words(
        self,
        view: BodyView,
        painting: Painting,
        v: int,
        code: int,
        cause: str | None,
        op: str,
        op_list: str | None,
    ) -> str:
        t = self.target_dtype
        template = _REASON_TEXT.get(code)
        if template is not None:
            return template.format(
                op=op, t=t, cause=cause, op_list=op_list, level=self.opt_level,
                by=f" ({cause})" if cause else "",
            )
        n = view.v_node[v]
        blocked = _BLOCK_TEXT.get(painting.node_block[n])
        if blocked is not None:
            return blocked.format(op=op)
        no_half = painting.f16[v] == 2 or (
            painting.f16[v] == 0
            and painting.supports_half is not None
            and not painting.supports_half(v)
        )
        if no_half:
            dev = device_type(view.devices[n], self.default_device_type)
            where = f" on {dev}" if self.check_kernels else ""
            return f"no {t} kernel registered for {op}{where}: kept float32"
        if op_list is None:
            return (
                f"{op} is on no list (numerical safety unknown): kept float32, with casts at "
                f"its edges"
            )
        if op_list == "infer":
            return f"infer op not between two {t} ops: kept float32 (casting would not pay)"
        if op_list == "clear":
            return f"clear op not connected to a {t} op through clear ops: kept float32"
        return f"{op_list} op left float32"
