"""``Painter``: runs the passes over one body, in order, and returns its ``Painting``."""

from __future__ import annotations

from tf_amp.config import RewriteConfig
from tf_amp.lists import OpLists
from tf_amp.painter.final_passes import (
    force_recurrent_edge_colour_match,
    remove_allow_without_half,
    retarget_casts_to_half,
)
from tf_amp.painter.propagation import (
    add_allow_list_ops,
    add_clear_and_infer_between_allow,
    add_infer_following_allow,
    propagate_allow_through_clear,
    propagate_deny_forward,
)
from tf_amp.painter.state import Painting, PaintState
from tf_amp.painter.tensor_lists import (
    find_tensor_list_clusters,
    force_tensor_list_colour_match,
)
from tf_amp.type_attrs import BodyView


class Painter:
    """Runs the passes over one BodyView. Construct per body; call ``paint()``.

    ``preserve``: node names whose dtype must not change (feeds, fetches); ``slow``: nodes
    measured slower in the target (``tf_amp.probe``). Both are kept float32, and so is every
    node of a body an excluded node calls (``body_excluded``).
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
        self.state = PaintState(view, config, lists, preserve, slow, body_excluded)

    def paint(self) -> Painting:
        """Run every pass in order and return the painting.

        The TensorList clusters are matched twice: once the seeds and deny are in place (so
        allow and deny spread from a whole cluster), and again after the safety net
        (spreading and unpainting may have split a cluster).
        """
        state = self.state
        clusters = find_tensor_list_clusters(state)
        if add_allow_list_ops(state) == 0:
            return state.result(nothing_to_do=True)
        propagate_deny_forward(state)
        force_tensor_list_colour_match(state, clusters)
        add_clear_and_infer_between_allow(state)
        add_infer_following_allow(state)
        propagate_allow_through_clear(state)
        remove_allow_without_half(state)
        force_tensor_list_colour_match(state, clusters)
        force_recurrent_edge_colour_match(state)
        retarget_casts_to_half(state)
        return state.result(nothing_to_do=False)
