"""The painter: named passes that colour float32 vertices allow (-> half) or leave them float32.

The passes follow the order of TensorFlow's own auto-mixed-precision pass (their names are its
contracts), over the (node, type-attr) vertices of ``tf_amp.type_attrs``:

1. ``find_tensor_list_clusters``: TensorList ops sharing a handle must agree on their element
   type; a cluster whose handle crosses a function boundary, a placeholder or a control-flow
   op is denied (the other side cannot be rewritten consistently).
2. ``add_allow_list_ops``: allow-list ops (or everything, at O2/O3) become half. None: nothing
   to do.
3. ``propagate_deny_forward``: deny spreads forward from deny-list ops through clear/infer
   vertices that lie upstream of a deny/infer op along a clear-only path (so ``Exp -> Add ->
   Sum`` stays float32 end to end).
4. ``add_clear_and_infer_between_allow``: clear/infer vertices both downstream and upstream of
   allow vertices become half (a cast pair would cost more than it saves).
4b. ``add_infer_following_allow`` (``RewriteConfig.infer_follows_allow``, on by default):
   an infer vertex fed directly by a half vertex turns half, as TensorFlow's pass 4
   (AddInferToAllowIfFollowAllow) does in its GPU and CPU modes alike.
5. ``propagate_allow_through_clear``: allow spreads both ways through clear vertices (never
   backwards into an implicit read of a ref variable).
6. ``remove_allow_without_half``: safety net: nothing stays allow without half support.
7. ``force_tensor_list_colour_match`` and ``force_recurrent_edge_colour_match``: a loop-carried
   value (NextIteration -> Merge) has one colour, so no cast sits on a back edge.
8. ``retarget_casts_to_half``: an existing Cast to float32 whose consumers are all half is
   made to cast to half directly.

Every painted vertex records (reason, neighbour vertex) so that the report can say in words
which pass painted it and because of which neighbour.

Modules: ``colours`` (colours and list categories), ``reasons``, ``eligibility`` (which nodes
may change; with ``normalization_guard``, the cancelling sums kept float32, and with
``update_guard``, the arithmetic that only updates variables), ``kernel_support``
(OpDef and kernel checks), ``state`` (``PaintState``, ``Painting``), ``tensor_lists`` (pass 1
and the cluster matching), ``propagation`` (passes 2-5), ``final_passes`` (6-8), ``pipeline``
(``Painter``, which runs them in order).
"""

from __future__ import annotations

from tf_amp.painter.colours import (
    ALLOW_C,
    CAT_ALLOW,
    CAT_CLEAR,
    CAT_DENY,
    CAT_INFER,
    CAT_NONE,
    DENY_C,
    NONE,
)
from tf_amp.painter.eligibility import DTYPE_BOUND_OPS, PINNED_OPS
from tf_amp.painter.pipeline import Painter
from tf_amp.painter.state import Painting

__all__ = [
    "ALLOW_C",
    "CAT_ALLOW",
    "CAT_CLEAR",
    "CAT_DENY",
    "CAT_INFER",
    "CAT_NONE",
    "DENY_C",
    "DTYPE_BOUND_OPS",
    "NONE",
    "PINNED_OPS",
    "Painter",
    "Painting",
]
