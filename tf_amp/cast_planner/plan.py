"""``plan_and_apply``: a painting turned into attr changes and Cast nodes, in four steps.

1. renames (name-preserving mode only): which nodes whose output turns half move to a new name,
   decided on the dtypes before anything changes;
2. attrs: every allow vertex's type attr becomes the target type (and, when on, float32 Consts
   read only by half ops become half Consts: ``const_folding``);
3. casts: one Cast per (producer output port, direction) where a tensor crosses a colour
   boundary, shared by every consumer that needs it;
4. float32 views (name-preserving mode): the old name of each moved node becomes a Cast back to
   float32, an IdentityN of per-port casts, or (a Switch) the untouched original.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tf_amp.cast_planner.cast_nodes import (
    CastNames,
    cast_node,
    counts_as_cast_to_half,
    graph_ref,
    reads_ref,
    suffix,
)
from tf_amp.cast_planner.const_folding import (
    SUM_OPS,
    fold_consts_in_place,
    saturated_half_copy,
)
from tf_amp.painter import ALLOW_C, Painting
from tf_amp.type_attrs import (
    DT_FLOAT,
    DT_FLOAT_REF,
    EXCLUDE_ATTR,
    FLOAT32_VIEW,
    RETVAL_OP,
    UNKNOWN_DTYPE,
    BodyView,
)

# Ops whose outputs are live or dead one by one (control flow): see ``_float32_switches``.
_DEAD_OUTPUT_OPS = frozenset({"Switch", "RefSwitch", "_SwitchN"})


@dataclass
class CastPlan:
    """What the planner did to one body."""

    type_attrs_converted: int = 0
    casts_to_half: int = 0  # excluding casts fed by a Const or a variable read
    casts_to_half_total: int = 0
    casts_to_float: int = 0
    consts_folded: int = 0
    folded_nodes: frozenset[int] = frozenset()  # Consts now half in place (for the report)
    renamed: dict[str, str] = field(default_factory=dict)  # old name -> half op's new name


def plan_and_apply(
    view: BodyView,
    painting: Painting,
    container: Any,
    target: int,
    preserve_names: bool = False,
    fold_constant_casts: bool = False,
) -> CastPlan:
    """Apply ``painting`` to the body's protos. ``container`` is the GraphDef (``.node``) or
    the FunctionDef (``.node_def``, ``.ret``) that owns ``view.protos``."""
    # Function bodies keep their names: their boundary is the signature, not node names.
    preserve_names = preserve_names and not view.is_function
    # Not in name-preserving mode (a TF1 Session): a feed of the Const must reach every
    # reader, and a copy under another name would not be fed.
    planner = _BodyPlanner(
        view, painting, container, target, fold_constant_casts and not preserve_names
    )
    renamed, out_dtypes = planner.choose_renames() if preserve_names else ({}, {})
    float_switches = planner.float32_switches(renamed)
    planner.convert_type_attrs()
    folded: set[int] = set()
    if fold_constant_casts and not preserve_names:
        folded = fold_consts_in_place(view, painting, target)
        planner.plan.consts_folded += len(folded)
        planner.plan.folded_nodes = frozenset(folded)
    planner.insert_boundary_casts(renamed, folded)
    planner.leave_float32_views(renamed, out_dtypes, float_switches)
    return planner.plan


class _BodyPlanner:
    """The steps of ``plan_and_apply`` over one body, sharing its view, names and counts."""

    def __init__(
        self,
        view: BodyView,
        painting: Painting,
        container: Any,
        target: int,
        fold_constant_casts: bool = False,
    ) -> None:
        self.view = view
        self.fold_constant_casts = fold_constant_casts
        self.painting = painting
        self.colour = painting.colour
        self.container = container
        self.target = target
        self.names = CastNames(view.index)
        self.new_nodes = container.node_def if view.is_function else container.node
        self.plan = CastPlan()

    def choose_renames(self) -> tuple[dict[int, str], dict[int, list[int]]]:
        """({node: its new name}, {node: its output dtypes before the change}) for the nodes
        with a half output whose every output dtype is known."""
        view, colour = self.view, self.colour
        renamed: dict[int, str] = {}
        out_dtypes: dict[int, list[int]] = {}
        for n in range(view.num_real):
            outs = view.out_v[n]
            if not any(v >= 0 and colour[v] == ALLOW_C for v in outs):
                continue
            dtypes = [view.port_dtype(n, p, output=True) for p in range(len(outs))]
            if UNKNOWN_DTYPE in dtypes:
                continue  # cannot rebuild every port under the old name: keep it in place
            out_dtypes[n] = dtypes
            new_name = f"{view.names[n]}/tf_amp_{suffix(self.target).lower()}"
            renamed[n] = self.names.fresh(new_name)
        return renamed, out_dtypes

    def float32_switches(self, renamed: dict[int, str]) -> dict[int, Any]:
        """Copies, taken before any change, of the renamed Switch-like nodes.

        A Switch's untaken output is dead, and so is anything that reads it, an IdentityN of
        both ports included: its float32 view must be a Switch too. The original node, kept
        as it was, is one: every tensor it reads keeps its name and float32 dtype here.
        """
        view = self.view
        return {n: _copy_node(view.protos[n]) for n in renamed if view.ops[n] in _DEAD_OUTPUT_OPS}

    def convert_type_attrs(self) -> None:
        """Every allow vertex's type attr (or list element) becomes the target type."""
        view, colour, target = self.view, self.colour, self.target
        for v in range(view.num_vertices):
            if colour[v] != ALLOW_C:
                continue
            proto = view.protos[view.v_node[v]]
            attr = view.v_attr[v]
            elem = view.v_elem[v]
            if elem < 0:
                proto.attr[attr].type = target
            else:
                proto.attr[attr].list.type[elem] = target
            self.plan.type_attrs_converted += 1

    def insert_boundary_casts(self, renamed: dict[int, str], folded: set[int]) -> None:
        """A Cast on every edge whose two ends differ in colour, one per producer port and
        direction; consumers of a renamed node's half output read its new name."""
        view, colour = self.view, self.colour
        e_src, e_sport, e_dst, e_dport = view.e_src, view.e_sport, view.e_dst, view.e_dport
        out_v, in_v = view.out_v, view.in_v
        casts: dict[tuple[int, int, tuple[str, ...]], str] = {}
        for k in range(len(e_src)):
            s, p, d, q = e_src[k], e_sport[k], e_dst[k], e_dport[k]
            svs = out_v[s]
            sv = svs[p] if p < len(svs) else -1
            src_allow = sv >= 0 and colour[sv] == ALLOW_C
            dvs = in_v[d]
            dv = dvs[q] if q < len(dvs) else -1
            dst_allow = dv >= 0 and colour[dv] == ALLOW_C
            if s in renamed:
                if src_allow and dst_allow:
                    self._set_input(d, view.e_pos[k], graph_ref(renamed[s], p))
                if src_allow == dst_allow or src_allow:
                    continue  # float consumers keep "name:p": the Cast/IdentityN there is float
            if src_allow == dst_allow or s in folded:
                continue
            if not src_allow and sv < 0:
                dtype = view.port_dtype(s, p, output=True)
                if dtype not in (DT_FLOAT, DT_FLOAT_REF, UNKNOWN_DTYPE):
                    continue  # not a float tensor (inconsistent graph): leave the edge alone
            controls = self._controls_of_an_aliased_read(s, d)
            ref = casts.get((s, p, controls))
            if ref is None:
                if s in renamed:
                    # A float port of a moved node: read its float32 view under the old name,
                    # so that feeding "old:p" (a TF1 Session's feed) reaches this Cast too.
                    src_text = graph_ref(view.names[s], p)
                else:
                    src_text = view.edge_text(k, self.container if view.is_function else None)
                ref = self._add_saturated_const(s) if dst_allow else None
                if ref is None:
                    ref = self._add_cast(s, p, src_text, to_half=dst_allow, controls=controls)
                casts[(s, p, controls)] = ref
            self._set_input(d, view.e_pos[k], ref)

    def leave_float32_views(
        self,
        renamed: dict[int, str],
        out_dtypes: dict[int, list[int]],
        float_switches: dict[int, Any],
    ) -> None:
        """Name-preserving: each moved node's old name becomes a float32 view of it, marked
        so that a later rewrite (e.g. at O2) does not paint it."""
        view, colour, target, new_nodes = self.view, self.colour, self.target, self.new_nodes
        for n, new_name in renamed.items():
            old = view.names[n]
            proto = view.protos[n]
            proto.name = new_name
            self.plan.renamed[old] = new_name
            outs = view.out_v[n]
            if n in float_switches:
                original = new_nodes.add()
                original.CopyFrom(float_switches[n])
                original.attr[EXCLUDE_ATTR].s = FLOAT32_VIEW
                continue
            if len(outs) == 1:
                view_node = cast_node(new_nodes, old, new_name, target, DT_FLOAT, proto.device)
                view_node.attr[EXCLUDE_ATTR].s = FLOAT32_VIEW
                self.plan.casts_to_float += 1
                continue
            identity = new_nodes.add()
            identity.name = old
            identity.op = "IdentityN"
            identity.attr[EXCLUDE_ATTR].s = FLOAT32_VIEW
            if proto.device:
                identity.device = proto.device
            for p, v in enumerate(outs):
                src = graph_ref(new_name, p)
                if v >= 0 and colour[v] == ALLOW_C:
                    cast_name = self.names.fresh(f"{old}-{p}-CastToFp32-tf_amp")
                    cast_node(new_nodes, cast_name, src, target, DT_FLOAT, proto.device)
                    self.plan.casts_to_float += 1
                    src = cast_name
                identity.input.append(src)
            identity.attr["T"].list.type.extend(out_dtypes[n])

    def _add_saturated_const(self, s: int) -> str | None:
        """For a float32 Const with a finite value beyond the target's range that float32 ops
        also read: a clipped half copy for its half readers (returns the input string that
        reads it), where a Cast would give them an infinity. None where a Cast is right."""
        view = self.view
        if not self.fold_constant_casts or s >= view.num_real:
            return None
        copy = saturated_half_copy(view.protos[s], self.target, lambda: self._added(s))
        if copy is None:
            return None
        copy.name = self.names.fresh(f"{view.names[s]}-0-CastTo{suffix(self.target)}-tf_amp")
        self.new_nodes.add().CopyFrom(copy)
        self.plan.consts_folded += 1
        return f"{copy.name}:output:0" if view.is_function else copy.name

    def _added(self, s: int) -> bool:
        """Whether a sum reads node ``s`` (one sweep of the edges: asked only for a Const
        beyond the target's range)."""
        view = self.view
        return any(
            src == s and view.ops[dst] in SUM_OPS
            for src, dst in zip(view.e_src, view.e_dst, strict=True)
        )

    def _controls_of_an_aliased_read(self, s: int, d: int) -> tuple[str, ...]:
        """The control inputs of consumer ``d`` when ``s`` is a TF1 reference variable or an
        Identity / Enter of one, else ().

        Such a read aliases the variable's buffer: the consumer reads it when it runs, after
        its control inputs (``with tf.control_dependencies([assign]): y = tf.matmul(x, w)``).
        A Cast copies it when the Cast runs, which may be before the assign: the half MatMul
        then read the old value, in 109 of 200 runs (and in every iteration of a loop that
        assigns then reads). The Cast takes the consumer's control inputs, and is shared only
        among consumers that have the same."""
        view = self.view
        if d >= view.num_real or not (
            view.ops[s] in ("Variable", "VariableV2") or reads_ref(view, s)
        ):
            return ()
        return tuple(sorted(i for i in view.protos[d].input if i.startswith("^")))

    def _add_cast(
        self, s: int, p: int, src_text: str, to_half: bool, controls: tuple[str, ...] = ()
    ) -> str:
        """Adds the Cast of output ``p`` of node ``s`` (after ``controls``); returns the
        input string that reads it."""
        view, plan, target = self.view, self.plan, self.target
        if to_half:
            plan.casts_to_half_total += 1
            if counts_as_cast_to_half(view, s):
                plan.casts_to_half += 1
            base = f"{view.names[s]}-{p}-CastTo{suffix(target)}-tf_amp"
            src_t, dst_t = DT_FLOAT, target
        else:
            plan.casts_to_float += 1
            base = f"{view.names[s]}-{p}-CastToFp32-tf_amp"
            src_t, dst_t = target, DT_FLOAT
        name = self.names.fresh(base)
        node = cast_node(self.new_nodes, name, src_text, src_t, dst_t, view.devices[s])
        node.input.extend(controls)
        return f"{name}:y:0" if view.is_function else name

    def _set_input(self, node: int, position: int, ref: str) -> None:
        """Point input ``position`` of ``node`` (index into NodeDef.input) at ``ref``."""
        view = self.view
        if node < view.num_real:
            view.protos[node].input[position] = ref
        elif view.ops[node] == RETVAL_OP:
            key = view.ret_keys[node - (len(view.names) - len(view.ret_keys))]
            self.container.ret[key] = ref


def _copy_node(proto: Any) -> Any:
    copy = type(proto)()
    copy.CopyFrom(proto)
    return copy
