"""The passes that spread colour along the graph, in the order the painter runs them.

- ``add_allow_list_ops``: the seed. Allow-list ops become half (at O2 every op but the deny
  list, at O3 every op that can); none at all means nothing to do.
- ``propagate_deny_forward``: deny spreads forward from deny-list ops through clear/infer
  vertices that lie upstream of a deny/infer op along a clear-only path, so ``Exp -> Add ->
  Sum`` stays float32 end to end.
- ``add_clear_and_infer_between_allow``: clear/infer vertices both downstream and upstream of
  allow vertices become half (a pair of casts would cost more than it saves).
- ``add_infer_following_allow`` (``RewriteConfig.infer_follows_allow``, on by default): an infer
  vertex fed directly by a half vertex turns half, as TensorFlow's pass 4
  (AddInferToAllowIfFollowAllow) does in its GPU and CPU modes alike.
- ``propagate_allow_through_clear``: allow spreads both ways through clear vertices (never
  backwards into an implicit read of a ref variable).
"""

from __future__ import annotations

from tf_amp.painter.colours import ALLOW_C, CAT_ALLOW, CAT_CLEAR, CAT_DENY, CAT_INFER, DENY_C, NONE
from tf_amp.painter.reasons import Reason
from tf_amp.painter.state import PaintState
from tf_amp.type_attrs import BodyView


def add_allow_list_ops(state: PaintState) -> int:
    """Seed: allow-list ops (O1) or every eligible half-capable vertex (O2: except the
    deny list; O3 / UNSAFE_FORCE_ALL: everything)."""
    level = state.config.opt_level
    if state.config.level == "UNSAFE_FORCE_ALL":
        level = "O3"
    n = 0
    for v in range(state.view.num_vertices):
        if state.colour[v]:
            continue
        cat = state.cat[v]
        if level == "O1":
            if cat != CAT_ALLOW:
                continue
            reason = Reason.ALLOW_LIST
        else:
            if level == "O2" and cat == CAT_DENY:
                continue
            # Casts keep their meaning (a boundary) at every level: painting one end of
            # a Cast would only move the boundary and, on a second rewrite, add another
            # Cast. retarget_casts_to_half handles Casts whose readers are all half.
            if cat != CAT_ALLOW and state.view.ops[state.view.v_node[v]] == "Cast":
                continue
            reason = Reason.ALLOW_LIST if cat == CAT_ALLOW else Reason.FORCED_LEVEL
        if state.can_paint(v):
            state.paint(v, ALLOW_C, reason)
            n += 1
    state.count("add_allow_list_ops", n)
    return n


def propagate_deny_forward(state: PaintState) -> None:
    """Deny-list vertices, plus every clear/infer vertex on a forward path from one to a
    deny/infer vertex through clear/infer vertices, stay float32."""
    level = state.config.opt_level
    if level == "O3" or state.config.level == "UNSAFE_FORCE_ALL":
        return
    view, cat, colour = state.view, state.cat, state.colour
    fanin, fanout = view.fanin, view.fanout
    upstream = bytearray(view.num_vertices)
    stack = [v for v in range(view.num_vertices) if cat[v] in (CAT_DENY, CAT_INFER)]
    for v in stack:
        upstream[v] = 1
    while stack:
        v = stack.pop()
        for u in fanin[v]:
            if not upstream[u] and cat[u] == CAT_CLEAR:
                upstream[u] = 1
                stack.append(u)
    n = 0
    stack = []
    for v in range(view.num_vertices):
        if cat[v] == CAT_DENY and colour[v] != DENY_C:
            state.paint(v, DENY_C, Reason.DENY_LIST)
            stack.append(v)
            n += 1
    if level == "O2":  # O2 keeps only the deny-list ops themselves in float32
        stack = []
    while stack:
        v = stack.pop()
        origin = v if cat[v] == CAT_DENY else state.cause[v]  # the deny-list op it follows
        for w in fanout[v]:
            if upstream[w] and colour[w] != DENY_C and cat[w] != CAT_ALLOW:
                reason = Reason.DENY_PROPAGATED_INFER if cat[w] == CAT_INFER else (
                    Reason.DENY_PROPAGATED)
                state.paint(w, DENY_C, reason, origin)
                stack.append(w)
                n += 1
    state.count("propagate_deny_forward", n)


def add_clear_and_infer_between_allow(state: PaintState) -> None:
    """Clear/infer vertices that are both downstream and upstream of allow vertices
    become allow."""
    view, cat, colour = state.view, state.cat, state.colour
    fanin, fanout = view.fanin, view.fanout
    downstream = bytearray(view.num_vertices)
    seeds = [v for v in range(view.num_vertices) if colour[v] == ALLOW_C]
    stack = list(seeds)
    while stack:
        v = stack.pop()
        for w in fanout[v]:
            if (
                not downstream[w]
                and colour[w] == NONE
                and cat[w] in (CAT_CLEAR, CAT_INFER)
                and state.can_paint(w)
            ):
                downstream[w] = 1
                stack.append(w)
    n = 0
    seen = bytearray(view.num_vertices)
    stack = list(seeds)
    while stack:
        v = stack.pop()
        for u in fanin[v]:
            if downstream[u] and not seen[u]:
                seen[u] = 1
                if colour[u] != ALLOW_C:
                    state.paint(u, ALLOW_C, Reason.BETWEEN_ALLOW, v)
                    n += 1
                stack.append(u)
    state.count("add_clear_and_infer_between_allow", n)


def add_infer_following_allow(state: PaintState) -> None:
    """TensorFlow's pass 4 (``RewriteConfig.infer_follows_allow``, on by default): an
    infer vertex fed directly by a half vertex, and by no deny vertex, turns half; applied
    in vertex order, so it runs down chains. TensorFlow 2.21 runs it in its CUDA GPU pass
    as well as its CPU / oneDNN modes (checked against the CUDA build:
    tests/test_differential_gpu.py), so it is part of the default painting; turning it
    off keeps those ops float32 (fewer Casts on some graphs, less work in half)."""
    if not state.config.infer_follows_allow:
        return
    view, cat, colour = state.view, state.cat, state.colour
    info_allowed = state.half.opdef_allows_half
    n = 0
    for v in range(view.num_vertices):
        if colour[v] != NONE or cat[v] != CAT_INFER:
            continue
        if not state.node_eligible[view.v_node[v]] or not info_allowed(v):
            continue
        cause = -1
        for u in view.fanin[v]:
            if colour[u] == DENY_C:
                cause = -1
                break
            if colour[u] == ALLOW_C and cause < 0:
                cause = u
        if cause >= 0:
            state.paint(v, ALLOW_C, Reason.FOLLOWS_ALLOW, cause)
            n += 1
    state.count("add_infer_following_allow", n)


def propagate_allow_through_clear(state: PaintState) -> None:
    """Allow spreads both ways through clear vertices (data movement costs nothing in
    half and saves a cast), except backwards into an implicit ref-variable read."""
    view, cat, colour = state.view, state.cat, state.colour
    fanin, fanout = view.fanin, view.fanout
    stack = [v for v in range(view.num_vertices) if colour[v] == ALLOW_C]
    ref_reads: dict[int, bool] = {}
    n = 0
    while stack:
        v = stack.pop()
        for neighbours in (fanin[v], fanout[v]):
            for u in neighbours:
                if (
                    colour[u] == NONE
                    and cat[u] == CAT_CLEAR
                    and state.can_paint(u)
                    and not _implicitly_reads_ref_variable(view, view.v_node[u], ref_reads)
                ):
                    state.paint(u, ALLOW_C, Reason.CLEAR_PROPAGATED, v)
                    n += 1
                    stack.append(u)
    state.count("propagate_allow_through_clear", n)


def _implicitly_reads_ref_variable(view: BodyView, node: int, cache: dict[int, bool]) -> bool:
    """An Identity of a TF1 ref variable, or an Enter (chain) of one: it reads the variable's
    float32 buffer in place, so it cannot be made half from the reader's side."""
    cached = cache.get(node)
    if cached is not None:
        return cached
    cache[node] = False  # cycle guard (Enter loops)
    result = False
    op = view.ops[node]
    if op in ("Identity", "Enter") and node < view.num_real:
        inputs = view.protos[node].input
        if inputs and not inputs[0].startswith("^"):
            name = inputs[0].split(":")[0]
            src = view.index.get(name)
            if src is not None:
                src_op = view.ops[src]
                if op == "Identity":
                    result = src_op in ("Variable", "VariableV2")
                else:
                    result = src_op in ("Variable", "VariableV2") or (
                        _implicitly_reads_ref_variable(view, src, cache)
                    )
    cache[node] = result
    return result
