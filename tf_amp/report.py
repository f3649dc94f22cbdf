"""The rewrite report: counts, TensorFlow's summary line, and a per-vertex decision in words.

Why words: TensorFlow's pass explains itself only through VLOG(2) lines that name internal
sets. A user asking "why is my LayerNorm still float32?" should get an answer like "fed by
float32-only op 'Exp' through clear/infer ops, and feeds a deny/infer op", with the pass that
decided it. The words of each painter reason and node block are the painter's own
(``tf_amp.painter.reasons``); the ones here cover vertices no pass painted. Decisions are built
lazily (a 1M-node rewrite should not pay for strings nobody reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tf_amp.painter import ALLOW_C, CAT_ALLOW, CAT_CLEAR, CAT_DENY, CAT_INFER, DENY_C, Painting
from tf_amp.painter.reasons import Block
from tf_amp.type_attrs import DT_BFLOAT16, DT_HALF, BodyView, device_type

_CAT_WORD = {CAT_ALLOW: "allow", CAT_INFER: "infer", CAT_CLEAR: "clear", CAT_DENY: "deny"}


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
        """TensorFlow's log line, word for word; for a float32 target (nothing is faster in
        reduced precision here), the same opening and why nothing was converted."""
        t = self.target_dtype
        if self.opt_level == "O0":
            return f"Converted 0/{self.nodes_before} nodes: opt level O0, graph left unchanged"
        if t == "float32":
            return (
                f"Converted 0/{self.nodes_before} nodes: target float32, graph left unchanged "
                f"({self.target_reason})"
            )
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

    def allow_ops_kept(self) -> dict[str, int]:
        """Allow-list nodes left float32, counted by why: a node block's name
        (``measured-slow``, ``excluded``, ...) or ``other`` (no kernel in the target, or a
        later pass). Where nothing changed, the log says this rather than that the graph
        holds no allow-list op: a probe that kept every MatMul float32 is not an empty graph."""
        counts: dict[str, int] = {}
        for body in self.bodies:
            view, painting = body.view, body.painting
            nodes = {
                view.v_node[v]
                for v in range(view.num_vertices)
                if painting.cat[v] == CAT_ALLOW and painting.colour[v] != ALLOW_C
            }
            for n in nodes:
                block = painting.node_block[n]
                why = Block(block).value if block else "other"
                counts[why] = counts.get(why, 0) + 1
        return counts

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
        painted_by = painting.reason[v]
        cause_v = painting.cause[v]
        cause = view.vertex_label(cause_v) if cause_v >= 0 else None
        op_list = _CAT_WORD.get(painting.cat[v])
        t = self.target_dtype
        paint = "allow" if colour == ALLOW_C else "deny" if colour == DENY_C else "none"
        dtype = t if colour == ALLOW_C else "float32"
        reason = self._words(view, painting, v, cause, op, op_list)
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
            pass_name=painted_by.pass_name,
            cause=cause,
            reason=reason,
        )

    def _words(
        self,
        view: BodyView,
        painting: Painting,
        v: int,
        cause: str | None,
        op: str,
        op_list: str | None,
    ) -> str:
        t = self.target_dtype
        template = painting.reason[v].template
        if template is not None:
            return template.format(
                op=op, t=t, cause=cause, op_list=op_list, level=self.opt_level,
                by=f" ({cause})" if cause else "",
            )
        n = view.v_node[v]
        # A Block, or "" for an eligible node (Block("") would raise).
        block = Block(painting.node_block[n]) if painting.node_block[n] else None
        if block is not None and block.template is not None:
            return block.template.format(op=op)
        no_half = painting.f16[v] == 2 or (
            painting.f16[v] == 0
            and painting.supports_half is not None
            and not painting.supports_half(v)
        )
        if no_half:
            info = view.infos[n]
            attr = view.v_attr[v]
            allowed = info.allowed.get(attr) if info is not None else None
            target = DT_HALF if t == "float16" else DT_BFLOAT16
            if allowed is not None and target not in allowed:
                return f"{op}'s OpDef does not allow {t} for {attr}: kept float32"
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
