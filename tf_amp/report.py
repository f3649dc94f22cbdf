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

from tf_amp.painter import (
    ALLOW_C,
    CAT_ALLOW,
    CAT_CLEAR,
    CAT_DENY,
    CAT_INFER,
    DENY_C,
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
    Painting,
)
from tf_amp.type_attrs import BodyView, device_type

_CAT_WORD = {CAT_ALLOW: "allow", CAT_INFER: "infer", CAT_CLEAR: "clear", CAT_DENY: "deny"}
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


@dataclass
class RewriteReport:
    """Counts and decisions of one ``rewrite_graph_def`` call (all bodies together)."""

    target_dtype: str = "float16"
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
        by = f" ({cause})" if cause else ""
        if code == R_ALLOW_LIST:
            return f"{op} is on the allow list: performance-critical and safe in {t}"
        if code == R_FORCED_LEVEL:
            return f"opt level {self.opt_level} converts every op that has a {t} kernel"
        if code == R_BETWEEN_ALLOW:
            return (
                f"{op_list} op lying between {t} ops (downstream and upstream of one, here "
                f"{cause}): converting it saves a pair of casts"
            )
        if code == R_FOLLOWS_ALLOW:
            return f"infer op fed directly by {t} op {cause} (infer_follows_allow)"
        if code == R_CLEAR_PROPAGATED:
            return f"clear op (moves data, no numeric effect) connected to {t} op {cause}"
        if code == R_TENSOR_LIST_MATCH_ALLOW:
            return f"TensorList sharing a handle with {t} list op {cause}: one element type"
        if code == R_RECURRENT_PAINT:
            return f"loop back edge: matches the colour of its Merge {cause}"
        if code == R_CAST_RETARGET:
            return f"existing Cast whose consumers are all {t}: now casts to {t} directly"
        if code == R_DENY_LIST:
            return f"{op} is on the deny list: numerically unsafe in {t}, kept float32"
        if code == R_DENY_PROPAGATED:
            return (
                f"fed (through clear/infer ops) by float32-only op {cause} and itself feeds a "
                f"deny/infer op: kept float32 so the unsafe value is not rounded"
            )
        if code == R_TENSOR_LIST_UNSAFE:
            return (
                "TensorList whose handle crosses a function, feed or control-flow boundary: "
                "the other side cannot be changed consistently, kept float32"
            )
        if code == R_TENSOR_LIST_MATCH_DENY:
            return f"TensorList sharing a handle with float32 list op {cause}: one element type"
        if code == R_NO_HALF_SUPPORT:
            return f"no {t} support (OpDef or kernel) for this attr: kept float32"
        if code == R_RECURRENT_UNPAINT:
            return f"loop-carried value: a Merge/NextIteration partner{by} is float32"
        n = view.v_node[v]
        block = painting.node_block[n]
        if block == "unknown-op":
            return f"op {op} is not registered with TensorFlow: kept float32, casts at its edges"
        if block == "preserved":
            return "node is preserved (feed/fetch): its dtype must not change"
        if block == "state":
            return "constant, feed or variable access: keeps its dtype (master weights)"
        if block == "function":
            return "calls a function; its signature stays float32 (the body is rewritten)"
        if block == "excluded":
            return "excluded by exclude_scopes or the _tf_amp_exclude attr: kept float32"
        if block == "device":
            return "not placed on a GPU (eligible_devices='gpu'): not processed"
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
