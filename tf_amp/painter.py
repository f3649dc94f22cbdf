"""The painter: named passes that colour float32 vertices allow (-> half) or leave them float32.

Each pass is a function whose name is its contract, in the order of DESIGN.md section 3:

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

Every painted vertex records (reason code, neighbour vertex) so that the report can say in
words which pass painted it and because of which neighbour.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tf_amp._upstream.tensorflow import kernels
from tf_amp.config import RewriteConfig
from tf_amp.lists import ALLOW, CLEAR, DENY, INFER, OpLists
from tf_amp.type_attrs import (
    ARG_OP,
    DT_BFLOAT16,
    DT_HALF,
    DT_VARIANT,
    EXCLUDE_NOT_READ,
    EXCLUDE_USER,
    EXCLUDE_VIEW,
    RETVAL_OP,
    BodyView,
    device_type,
    exclude_mark,
)

logger = logging.getLogger("tf_amp")

# colours
NONE, ALLOW_C, DENY_C = 0, 1, 2
# list categories (bytes)
CAT_NONE, CAT_ALLOW, CAT_INFER, CAT_CLEAR, CAT_DENY = 0, 1, 2, 3, 4
_CAT = {ALLOW: CAT_ALLOW, INFER: CAT_INFER, CLEAR: CAT_CLEAR, DENY: CAT_DENY}

# reason codes (what painted / unpainted a vertex); words live in tf_amp.report
R_NONE = 0
R_ALLOW_LIST = 1
R_FORCED_LEVEL = 2
R_DENY_LIST = 3
R_DENY_PROPAGATED = 4
R_TENSOR_LIST_UNSAFE = 5
R_TENSOR_LIST_MATCH_ALLOW = 6
R_TENSOR_LIST_MATCH_DENY = 7
R_BETWEEN_ALLOW = 8
R_CLEAR_PROPAGATED = 9
R_NO_HALF_SUPPORT = 10
R_RECURRENT_UNPAINT = 11
R_RECURRENT_PAINT = 12
R_CAST_RETARGET = 13
R_FOLLOWS_ALLOW = 14

# Ops that must keep their dtype whatever the lists say: feeds, constants (their tensor bytes
# are float32), variables (master weights), checkpoints and cross-device transfers.
PINNED_OPS: frozenset[str] = frozenset(
    {
        "Const",
        "HostConst",
        "Placeholder",
        "PlaceholderV2",
        "PlaceholderWithDefault",
        "Variable",
        "VariableV2",
        "VarHandleOp",
        "ReadVariableOp",
        "_Arg",
        "_Retval",
        "_Send",
        "_Recv",
        "_HostSend",
        "_HostRecv",
        "Send",
        "Recv",
        "SaveV2",
        "RestoreV2",
        "Save",
        "SaveSlices",
        "Restore",
        "RestoreSlice",
        "MergeV2Checkpoints",
    }
)

# Ops whose float type is part of what they compute, not its precision, so O2/O3 (which paint
# every half-capable op) must leave them alone too: Bitcast reinterprets the bits; Python
# functions return what their code returns; DecodeRaw/ParseTensor/SerializeTensor/Fingerprint
# read or write the bytes of a dtype; Range counts (float16 cannot hold integers above 2048,
# and its shape function rejects half, so the graph would not even import).
DTYPE_BOUND_OPS: frozenset[str] = frozenset(
    {
        "Bitcast",
        "PyFunc",
        "PyFuncStateless",
        "EagerPyFunc",
        "DecodeRaw",
        "DecodePaddedRaw",
        "ParseTensor",
        "SerializeTensor",
        "Fingerprint",
        "Range",
    }
)

# TensorList handles that reach these cannot be followed: the list is shared with code this
# rewrite of this body cannot see (another function, a feed, a control-flow body).
_TENSOR_LIST_SINKS: frozenset[str] = frozenset(
    {
        ARG_OP,
        RETVAL_OP,
        "Placeholder",
        "PartitionedCall",
        "StatefulPartitionedCall",
        "OptionalFromValue",
        "OptionalGetValue",
        "While",
        "StatelessWhile",
        "If",
        "StatelessIf",
        "Case",
        "StatelessCase",
    }
)
_TENSOR_LIST_WRITERS: frozenset[str] = frozenset(
    {
        "TensorListFromTensor",
        "TensorListPushBack",
        "TensorListPushBackBatch",
        "TensorListScatter",
        "TensorListScatterV2",
        "TensorListScatterIntoExistingList",
        "TensorListSetItem",
        "TensorListSplit",
    }
)
_TENSOR_LIST_READERS: frozenset[str] = frozenset(
    {
        "TensorListConcat",
        "TensorListConcatV2",
        "TensorListGather",
        "TensorListGetItem",
        "TensorListPopBack",
        "TensorListStack",
    }
)

_KERNEL_TABLE: dict[tuple[str, str], list[list[tuple[str, frozenset[int]]]]] = {}
_KERNEL_CHECK: dict[tuple[Any, ...], bool] = {}


def _kernel_constraints(op: str, dev: str) -> list[list[tuple[str, frozenset[int]]]]:
    """Type constraints of every unlabelled kernel of ``op`` on device type ``dev`` (cached)."""
    key = (op, dev)
    table = _KERNEL_TABLE.get(key)
    if table is None:
        table = []
        try:
            kernel_list = kernels.get_registered_kernels_for_op(op)
        except Exception:  # noqa: BLE001 - an op with no kernels at all (e.g. a function)
            kernel_list = None
        if kernel_list is not None:
            for kdef in kernel_list.kernel:
                # DEFAULT kernels serve every device type (TensorFlow falls back to them).
                if kdef.device_type not in (dev, "DEFAULT") or kdef.label:
                    continue
                table.append(
                    [(c.name, frozenset(c.allowed_values.list.type)) for c in kdef.constraint]
                )
        _KERNEL_TABLE[key] = table
    return table


# Name prefixes of gradient ops: TF2 tapes and TF1 tf.gradients (gradients, gradients_1, ...).
_GRADIENT_PREFIX = re.compile(r"(?:gradient_tape|gradients(?:_\d+)?)/")


@dataclass
class Painting:
    """The painter's result for one body: a colour and a reason per vertex."""

    colour: bytearray
    reason: list[int]
    cause: list[int]  # neighbour vertex that caused the paint, or -1
    cat: bytearray
    node_eligible: bytearray  # per node: may change at all
    node_block: list[str]  # per node: why not eligible ("" if eligible)
    f16: bytearray  # per vertex: 0 unknown, 1 supports half, 2 does not
    pass_counts: dict[str, int] = field(default_factory=dict)
    nothing_to_do: bool = False
    supports_half: Callable[[int], bool] | None = None  # for the report, evaluated lazily


class Painter:
    """Runs the passes over one BodyView. Construct per body; call ``paint()``."""

    def __init__(
        self,
        view: BodyView,
        config: RewriteConfig,
        lists: OpLists,
        preserve: frozenset[str] = frozenset(),
        slow: frozenset[str] = frozenset(),
    ) -> None:
        self.view = view
        self.config = config
        self.slow = slow  # nodes measured slower in the target (tf_amp.probe): kept float32
        self.lists = lists
        self.preserve = preserve
        self.target = DT_HALF if config.target_dtype == "float16" else DT_BFLOAT16
        nv = view.num_vertices
        self.colour = bytearray(nv)
        self.reason = [R_NONE] * nv
        self.cause = [-1] * nv
        self.f16 = bytearray(nv)
        self.cat = bytearray(nv)
        self.node_eligible = bytearray(len(view.names))
        self.node_block = [""] * len(view.names)
        self.counts: dict[str, int] = {}
        self._implicit_ref: dict[int, bool] = {}
        self._compute_categories_and_eligibility()

    # ------------------------------------------------------------------ set-up
    def _compute_categories_and_eligibility(self) -> None:
        view, config = self.view, self.config
        category = self.lists.category
        op_cat: dict[str, int] = {}
        for v, n in enumerate(view.v_node):
            op = view.ops[n]
            c = op_cat.get(op)
            if c is None:
                c = _CAT.get(category(op) or "", CAT_NONE)
                op_cat[op] = c
            self.cat[v] = c
        scopes = tuple(s.rstrip("/") for s in config.exclude_scopes if s.strip("/"))
        prefixes = tuple(s + "/" for s in scopes)
        scope_set = frozenset(scopes)
        gpu_only = config.eligible_devices == "gpu"
        default_dev = config.default_device_type
        exclude_attr = view.exclude_attr
        for n in range(view.num_real):
            info = view.infos[n]
            op = view.ops[n]
            name = view.names[n]
            block = ""
            if info is None:
                block = "unknown-op"
            elif name in self.preserve:
                block = "preserved"
            elif name in self.slow:
                block = "measured-slow"
            elif op in PINNED_OPS or info.touches_state:
                block = "state"
            elif op in DTYPE_BOUND_OPS:
                block = "dtype-bound"
            elif info.is_function or info.has_func_attr:
                block = "function"
            elif prefixes and (name in scope_set or name.startswith(prefixes)):
                block = "excluded"
            elif gpu_only and device_type(view.devices[n], default_dev) != "GPU":
                block = "device"
            else:
                mark = exclude_attr[n]
                if mark == EXCLUDE_NOT_READ:
                    mark = exclude_mark(view.protos[n].attr)
                if mark == EXCLUDE_USER:
                    block = "excluded"
                elif mark == EXCLUDE_VIEW:
                    block = "float32-view"
            if block:
                self.node_block[n] = block
            else:
                self.node_eligible[n] = 1
        self._exclude_backward_of_excluded(view)
        for n in range(view.num_real, len(view.names)):
            self.node_block[n] = "function-boundary"

    def _exclude_backward_of_excluded(self, view: Any) -> None:
        """Keeps the gradient ops of an excluded region float32 like its forward ops.

        A region excluded by name scope or by ``_tf_amp_exclude`` (``tf_amp.keep_float32``)
        would otherwise run its backward pass in half: gradient ops carry neither the scope nor
        the attribute. They are named after the forward op they differentiate:
        ``gradient_tape/<forward op>/...`` (TF2 tapes) or ``gradients[_N]/<forward op>_grad/...``
        (TF1 ``tf.gradients``), so a gradient op whose forward path lies under an excluded node
        is excluded too.
        """
        excluded = {view.names[n] for n in range(view.num_real)
                    if self.node_block[n] == "excluded"}
        if not excluded:
            return
        for n in range(view.num_real):
            if not self.node_eligible[n]:
                continue
            match = _GRADIENT_PREFIX.match(view.names[n])
            if match is None:
                continue
            parts = [p[:-5] if p.endswith("_grad") else p
                     for p in view.names[n][match.end():].split("/")]
            for depth in range(1, len(parts) + 1):
                if "/".join(parts[:depth]) in excluded:
                    self.node_eligible[n] = 0
                    self.node_block[n] = "excluded"
                    break

    def supports_half(self, v: int) -> bool:
        """OpDef allows the target type for this attr, and (unless disabled) a kernel with it
        is registered for the node's device type. Cached per (op, device, attr, types)."""
        state = self.f16[v]
        if state:
            return state == 1
        ok = self._supports_half_uncached(v)
        self.f16[v] = 1 if ok else 2
        return ok

    def _supports_half_uncached(self, v: int) -> bool:
        view = self.view
        n = view.v_node[v]
        info = view.infos[n]
        if info is None:
            return False
        attr = view.v_attr[v]
        allowed = info.allowed.get(attr)
        if allowed is not None and self.target not in allowed:
            return False
        if not self.config.check_kernels:
            return True
        dev = device_type(view.devices[n], self.config.default_device_type)
        elem = view.v_elem[v]
        key = (view.ops[n], dev, attr, elem, view.node_sig[n])
        cached = _KERNEL_CHECK.get(key)
        if cached is not None:
            return cached
        values = dict(zip(info.type_attrs + info.list_type_attrs, view.node_sig[n], strict=False))
        if elem < 0:
            values[attr] = self.target
        else:
            lst = list(values[attr])
            lst[elem] = self.target
            values[attr] = tuple(lst)
        ok = False
        for constraints in _kernel_constraints(view.ops[n], dev):
            good = True
            for cname, allowed_types in constraints:
                value = values.get(cname)
                if value is None:
                    continue
                if isinstance(value, tuple):
                    if not all(t in allowed_types for t in value):
                        good = False
                        break
                elif value not in allowed_types:
                    good = False
                    break
            if good:
                ok = True
                break
        _KERNEL_CHECK[key] = ok
        return ok

    def _can_paint(self, v: int) -> bool:
        return bool(self.node_eligible[self.view.v_node[v]]) and self.supports_half(v)

    def _paint(self, v: int, colour: int, reason: int, cause: int = -1) -> None:
        self.colour[v] = colour
        self.reason[v] = reason
        self.cause[v] = cause

    def _count(self, name: str, n: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + n
        logger.debug("pass %s: %d vertices changed", name, n)

    # ------------------------------------------------------------------ passes
    def find_tensor_list_clusters(self) -> list[list[int]]:
        """Group float32 TensorList element-type vertices by shared handle (union-find over
        DT_VARIANT edges). Unsafe clusters are painted deny. Also adds implicit writer ->
        reader edges so that colour flows through a list like through a tensor."""
        view = self.view
        members = [
            v
            for v in range(view.num_vertices)
            if view.v_attr[v] == "element_dtype" and "TensorList" in view.ops[view.v_node[v]]
        ]
        if not members:
            return []
        parent = list(range(len(view.names)))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        def is_sink(n: int) -> bool:
            if view.ops[n] in _TENSOR_LIST_SINKS:
                return True
            if n >= view.num_real:
                return False
            info = view.infos[n]
            return info is None or info.is_function or info.has_func_attr

        # Handles are followed through ordinary nodes (Identity, Switch, Merge, Enter, ...) but
        # not through sinks: lists on the two sides of a While/If/call stay separate clusters,
        # each denied because it touches the boundary.
        touching_sink: list[int] = []
        for k in range(len(view.e_src)):
            s, p = view.e_src[k], view.e_sport[k]
            if view.port_dtype(s, p, output=True) != DT_VARIANT:
                continue
            d = view.e_dst[k]
            s_sink, d_sink = is_sink(s), is_sink(d)
            if s_sink or d_sink:
                if not s_sink:
                    touching_sink.append(s)
                if not d_sink:
                    touching_sink.append(d)
                continue
            a, b = find(s), find(d)
            if a != b:
                parent[max(a, b)] = min(a, b)
        unsafe_roots: set[int] = {find(n) for n in touching_sink}
        clusters: dict[int, list[int]] = {}
        for v in members:
            root = find(view.v_node[v])
            clusters.setdefault(root, []).append(v)
            if not self.node_eligible[view.v_node[v]]:
                unsafe_roots.add(root)
        result = []
        denied = 0
        for root, cluster in sorted(clusters.items()):
            if root in unsafe_roots:
                for v in cluster:
                    self._paint(v, DENY_C, R_TENSOR_LIST_UNSAFE)
                    denied += 1
            writers = [v for v in cluster if view.ops[view.v_node[v]] in _TENSOR_LIST_WRITERS]
            readers = [v for v in cluster if view.ops[view.v_node[v]] in _TENSOR_LIST_READERS]
            for w in writers:
                for r in readers:
                    view.add_edge(w, r)
            result.append(cluster)
        self._count("find_tensor_list_clusters(denied)", denied)
        return result

    def add_allow_list_ops(self) -> int:
        """Seed: allow-list ops (O1) or every eligible half-capable vertex (O2: except the
        deny list; O3 / UNSAFE_FORCE_ALL: everything)."""
        level = self.config.opt_level
        if self.config.level == "UNSAFE_FORCE_ALL":
            level = "O3"
        n = 0
        for v in range(self.view.num_vertices):
            if self.colour[v]:
                continue
            cat = self.cat[v]
            if level == "O1":
                if cat != CAT_ALLOW:
                    continue
                reason = R_ALLOW_LIST
            else:
                if level == "O2" and cat == CAT_DENY:
                    continue
                # Casts keep their meaning (a boundary) at every level: painting one end of
                # a Cast would only move the boundary and, on a second rewrite, add another
                # Cast. retarget_casts_to_half handles Casts whose readers are all half.
                if cat != CAT_ALLOW and self.view.ops[self.view.v_node[v]] == "Cast":
                    continue
                reason = R_ALLOW_LIST if cat == CAT_ALLOW else R_FORCED_LEVEL
            if self._can_paint(v):
                self._paint(v, ALLOW_C, reason)
                n += 1
        self._count("add_allow_list_ops", n)
        return n

    def propagate_deny_forward(self) -> None:
        """Deny-list vertices, plus every clear/infer vertex on a forward path from one to a
        deny/infer vertex through clear/infer vertices, stay float32."""
        level = self.config.opt_level
        if level == "O3" or self.config.level == "UNSAFE_FORCE_ALL":
            return
        view, cat, colour = self.view, self.cat, self.colour
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
                self._paint(v, DENY_C, R_DENY_LIST)
                stack.append(v)
                n += 1
        if level == "O2":  # O2 keeps only the deny-list ops themselves in float32
            stack = []
        while stack:
            v = stack.pop()
            for w in fanout[v]:
                if upstream[w] and colour[w] != DENY_C and cat[w] != CAT_ALLOW:
                    self._paint(w, DENY_C, R_DENY_PROPAGATED, v)
                    stack.append(w)
                    n += 1
        self._count("propagate_deny_forward", n)

    def force_tensor_list_colour_match(self, clusters: list[list[int]]) -> None:
        """All vertices of a TensorList cluster take one colour: deny if any is deny, else
        allow if any is allow."""
        n = 0
        for cluster in clusters:
            deny = [v for v in cluster if self.colour[v] == DENY_C]
            allow = [v for v in cluster if self.colour[v] == ALLOW_C]
            if deny:
                for v in cluster:
                    if self.colour[v] != DENY_C:
                        self._paint(v, DENY_C, R_TENSOR_LIST_MATCH_DENY, deny[0])
                        n += 1
            elif allow:
                for v in cluster:
                    if self.colour[v] != ALLOW_C:
                        self._paint(v, ALLOW_C, R_TENSOR_LIST_MATCH_ALLOW, allow[0])
                        n += 1
        self._count("force_tensor_list_colour_match", n)

    def add_clear_and_infer_between_allow(self) -> None:
        """Clear/infer vertices that are both downstream and upstream of allow vertices
        become allow."""
        view, cat, colour = self.view, self.cat, self.colour
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
                    and self._can_paint(w)
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
                        self._paint(u, ALLOW_C, R_BETWEEN_ALLOW, v)
                        n += 1
                    stack.append(u)
        self._count("add_clear_and_infer_between_allow", n)

    def add_infer_following_allow(self) -> None:
        """TensorFlow's pass 4 (``RewriteConfig.infer_follows_allow``, on by default): an
        infer vertex fed directly by a half vertex, and by no deny vertex, turns half; applied
        in vertex order, so it runs down chains. TensorFlow 2.21 runs it in its CUDA GPU pass
        as well as its CPU / oneDNN modes (checked against the CUDA build:
        tests/test_differential_gpu.py), so it is part of the default painting; turning it
        off keeps those ops float32 (fewer Casts on some graphs, less work in half)."""
        if not self.config.infer_follows_allow:
            return
        view, cat, colour = self.view, self.cat, self.colour
        info_allowed = self._opdef_allows_half
        n = 0
        for v in range(view.num_vertices):
            if colour[v] != NONE or cat[v] != CAT_INFER:
                continue
            if not self.node_eligible[view.v_node[v]] or not info_allowed(v):
                continue
            cause = -1
            for u in view.fanin[v]:
                if colour[u] == DENY_C:
                    cause = -1
                    break
                if colour[u] == ALLOW_C and cause < 0:
                    cause = u
            if cause >= 0:
                self._paint(v, ALLOW_C, R_FOLLOWS_ALLOW, cause)
                n += 1
        self._count("add_infer_following_allow", n)

    def _opdef_allows_half(self, v: int) -> bool:
        info = self.view.infos[self.view.v_node[v]]
        if info is None:
            return False
        allowed = info.allowed.get(self.view.v_attr[v])
        return allowed is None or self.target in allowed

    def propagate_allow_through_clear(self) -> None:
        """Allow spreads both ways through clear vertices (data movement costs nothing in
        half and saves a cast), except backwards into an implicit ref-variable read."""
        view, cat, colour = self.view, self.cat, self.colour
        fanin, fanout = view.fanin, view.fanout
        stack = [v for v in range(view.num_vertices) if colour[v] == ALLOW_C]
        n = 0
        while stack:
            v = stack.pop()
            for neighbours in (fanin[v], fanout[v]):
                for u in neighbours:
                    if (
                        colour[u] == NONE
                        and cat[u] == CAT_CLEAR
                        and self._can_paint(u)
                        and not self._implicitly_reads_ref_variable(view.v_node[u])
                    ):
                        self._paint(u, ALLOW_C, R_CLEAR_PROPAGATED, v)
                        n += 1
                        stack.append(u)
        self._count("propagate_allow_through_clear", n)

    def remove_allow_without_half(self) -> None:
        """Safety net: no vertex stays allow unless half is supported for it."""
        n = 0
        for v in range(self.view.num_vertices):
            if self.colour[v] == ALLOW_C and not self.supports_half(v):
                self._paint(v, NONE, R_NO_HALF_SUPPORT)
                n += 1
        self._count("remove_allow_without_half", n)

    def force_recurrent_edge_colour_match(self) -> None:
        """A NextIteration and the Merge nodes it feeds share one colour: half only if every
        such Merge is half; otherwise all float32. Keeps casts off loop back edges."""
        view = self.view
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
                self.colour[m] == ALLOW_C and view.ops[view.v_node[m]] == "Merge" for m in merges
            )
            if all_allow:
                if self.colour[vn] != ALLOW_C and self._can_paint(vn):
                    self._paint(vn, ALLOW_C, R_RECURRENT_PAINT, merges[0])
                    n += 1
                elif self.colour[vn] != ALLOW_C:
                    for m in merges:
                        self._paint(m, NONE, R_RECURRENT_UNPAINT, vn)
                        n += 1
            else:
                not_allow = next((m for m in merges if self.colour[m] != ALLOW_C), vn)
                for m in [*merges, vn]:
                    if self.colour[m] == ALLOW_C:
                        self._paint(m, NONE, R_RECURRENT_UNPAINT, not_allow)
                        n += 1
        self._count("force_recurrent_edge_colour_match", n)

    def retarget_casts_to_half(self) -> None:
        """An existing Cast to float32 whose consumers are all half casts to half instead
        (one Cast instead of two)."""
        view = self.view
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
            all_allow[s] = dv >= 0 and self.colour[dv] == ALLOW_C
        n = 0
        for s, ok in all_allow.items():
            v = cast_nodes[s]
            if ok and self.colour[v] != ALLOW_C and self._can_paint(v):
                self._paint(v, ALLOW_C, R_CAST_RETARGET)
                n += 1
        self._count("retarget_casts_to_half", n)

    def _implicitly_reads_ref_variable(self, node: int) -> bool:
        cached = self._implicit_ref.get(node)
        if cached is not None:
            return cached
        self._implicit_ref[node] = False  # cycle guard (Enter loops)
        view = self.view
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
                            self._implicitly_reads_ref_variable(src)
                        )
        self._implicit_ref[node] = result
        return result

    # ------------------------------------------------------------------ driver
    def paint(self) -> Painting:
        """Run every pass in order and return the painting."""
        steps: list[Callable[[], Any]] = []
        clusters = self.find_tensor_list_clusters()
        seeded = self.add_allow_list_ops()
        nothing = seeded == 0
        if not nothing:
            steps = [
                self.propagate_deny_forward,
                lambda: self.force_tensor_list_colour_match(clusters),
                self.add_clear_and_infer_between_allow,
                self.add_infer_following_allow,
                self.propagate_allow_through_clear,
                self.remove_allow_without_half,
                lambda: self.force_tensor_list_colour_match(clusters),
                self.force_recurrent_edge_colour_match,
                self.retarget_casts_to_half,
            ]
            for step in steps:
                step()
        return Painting(
            colour=self.colour,
            reason=self.reason,
            cause=self.cause,
            cat=self.cat,
            node_eligible=self.node_eligible,
            node_block=self.node_block,
            f16=self.f16,
            pass_counts=self.counts,
            nothing_to_do=nothing,
            supports_half=self.supports_half,
        )
