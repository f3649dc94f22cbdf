"""The passes that run once colours have spread: safety net, loops, existing Casts.

- ``remove_allow_without_half``: nothing stays allow without half support (OpDef and kernel).
- ``force_recurrent_edge_colour_match``: a loop-carried value (NextIteration -> Merge) has one
  colour, so no cast sits on a loop's back edge.
- ``retarget_casts_to_half``: an existing Cast to float32 whose consumers are all half casts to
  half directly (one Cast instead of two).

(The TensorList clusters are matched once more between the first and the second of these:
``tf_amp.painter.tensor_lists``.)
"""

from __future__ import annotations

from tf_amp.painter.colours import ALLOW_C, NONE
from tf_amp.painter.reasons import Reason
from tf_amp.painter.state import PaintState


def remove_allow_without_half(state: PaintState) -> None:
    """Safety net: no vertex stays allow unless half is supported for it."""
    n = 0
    for v in range(state.view.num_vertices):
        if state.colour[v] == ALLOW_C and not state.half.supports_half(v):
            state.paint(v, NONE, Reason.NO_HALF_SUPPORT)
            n += 1
    state.count("remove_allow_without_half", n)


def force_recurrent_edge_colour_match(state: PaintState) -> None:
    """A NextIteration and the Merge nodes it feeds share one colour: half only if every
    such Merge is half; otherwise all float32. Keeps casts off loop back edges."""
    view = state.view
    n = 0
    for node in range(view.num_real):
        if view.ops[node] != "NextIteration":
            continue
        outs = view.out_v[node]
        vn = outs[0] if outs else -1
        if vn < 0:
            continue
        merges = view.fanout[vn]
        all_allow = bool(merges) and all(
            state.colour[m] == ALLOW_C and view.ops[view.v_node[m]] == "Merge" for m in merges
        )
        if all_allow:
            if state.colour[vn] != ALLOW_C and state.can_paint(vn):
                state.paint(vn, ALLOW_C, Reason.RECURRENT_PAINT, merges[0])
                n += 1
            elif state.colour[vn] != ALLOW_C:
                for m in merges:
                    state.paint(m, NONE, Reason.RECURRENT_UNPAINT, vn)
                    n += 1
        else:
            not_allow = next((m for m in merges if state.colour[m] != ALLOW_C), vn)
            for m in [*merges, vn]:
                if state.colour[m] == ALLOW_C:
                    state.paint(m, NONE, Reason.RECURRENT_UNPAINT, not_allow)
                    n += 1
    state.count("force_recurrent_edge_colour_match", n)


def retarget_casts_to_half(state: PaintState) -> None:
    """An existing Cast to float32 whose consumers are all half casts to half instead
    (one Cast instead of two)."""
    view = state.view
    cast_nodes = {
        n: view.out_v[n][0]
        for n in range(view.num_real)
        if view.ops[n] == "Cast" and view.out_v[n] and view.out_v[n][0] >= 0
    }
    if not cast_nodes:
        return
    all_allow: dict[int, bool] = {}
    for k in range(len(view.e_src)):
        s = view.e_src[k]
        if s not in cast_nodes or not all_allow.get(s, True):
            continue
        dv_list = view.in_v[view.e_dst[k]]
        q = view.e_dport[k]
        dv = dv_list[q] if q < len(dv_list) else -1
        all_allow[s] = dv >= 0 and state.colour[dv] == ALLOW_C
    n = 0
    for s, ok in all_allow.items():
        v = cast_nodes[s]
        if ok and state.colour[v] != ALLOW_C and state.can_paint(v):
            state.paint(v, ALLOW_C, Reason.CAST_RETARGET)
            n += 1
    state.count("retarget_casts_to_half", n)
