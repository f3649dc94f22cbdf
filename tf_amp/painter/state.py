"""The painting of one body, while the passes run (``PaintState``) and after (``Painting``).

Every vertex has a colour, the ``Reason`` of the pass that last set it and the neighbour
vertex that caused it (-1: none), so that the report can say in words which pass decided a
vertex and because of which neighbour. Passes change colours only through ``PaintState.paint``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from tf_amp.config import RewriteConfig
from tf_amp.lists import OpLists
from tf_amp.painter.eligibility import list_categories, node_eligibility
from tf_amp.painter.kernel_support import HalfSupport
from tf_amp.painter.reasons import Reason
from tf_amp.type_attrs import DT_BFLOAT16, DT_HALF, BodyView

logger = logging.getLogger("tf_amp")


@dataclass
class Painting:
    """The painter's result for one body: a colour and a reason per vertex."""

    colour: bytearray
    reason: list[Reason]  # what painted each vertex (Reason.NONE: nothing)
    cause: list[int]  # neighbour vertex that caused the paint, or -1
    cat: bytearray
    node_eligible: bytearray  # per node: may change at all
    node_block: list[str]  # per node: a Block saying why not eligible, "" if eligible
    f16: bytearray  # per vertex: 0 unknown, 1 supports half, 2 does not
    pass_counts: dict[str, int] = field(default_factory=dict)
    nothing_to_do: bool = False
    supports_half: Callable[[int], bool] | None = None  # for the report, evaluated lazily


class PaintState:
    """What the passes read and write for one body.

    Read: the view, the config, the target type, each vertex's list category, each node's
    eligibility, half support (asked lazily). Written: colour, reason and cause per vertex,
    and how many vertices each pass changed (``counts``, logged and summed into the report).
    """

    def __init__(
        self,
        view: BodyView,
        config: RewriteConfig,
        lists: OpLists,
        preserve: frozenset[str] = frozenset(),
        slow: frozenset[str] = frozenset(),
        body_excluded: bool = False,
    ) -> None:
        self.view = view
        self.config = config
        self.target = DT_HALF if config.target_dtype == "float16" else DT_BFLOAT16
        nv = view.num_vertices
        self.colour = bytearray(nv)
        self.reason = [Reason.NONE] * nv
        self.cause = [-1] * nv
        self.counts: dict[str, int] = {}
        self.cat = list_categories(view, lists)
        # slow: nodes measured slower in the target (tf_amp.probe), kept float32
        self.node_eligible, self.node_block = node_eligibility(
            view, config, lists, preserve, slow, body_excluded
        )
        self.half = HalfSupport(view, config, self.target)

    def can_paint(self, v: int) -> bool:
        """The vertex's node may change and the vertex may hold the target type."""
        return bool(self.node_eligible[self.view.v_node[v]]) and self.half.supports_half(v)

    def paint(self, v: int, colour: int, reason: Reason, cause: int = -1) -> None:
        self.colour[v] = colour
        self.reason[v] = reason
        self.cause[v] = cause

    def count(self, name: str, n: int) -> None:
        """Records that pass ``name`` changed ``n`` vertices."""
        self.counts[name] = self.counts.get(name, 0) + n
        logger.debug("pass %s: %d vertices changed", name, n)

    def result(self, nothing_to_do: bool) -> Painting:
        return Painting(
            colour=self.colour,
            reason=self.reason,
            cause=self.cause,
            cat=self.cat,
            node_eligible=self.node_eligible,
            node_block=self.node_block,
            f16=self.half.f16,
            pass_counts=self.counts,
            nothing_to_do=nothing_to_do,
            supports_half=self.half.supports_half,
        )
