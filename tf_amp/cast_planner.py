"""The cast planner: turn a painting into attr changes and Cast nodes, in place on a copy.

Rules (why):
- Every allow vertex's type attr becomes the target type; nothing else changes dtype.
- A Cast goes where a tensor crosses a colour boundary, at the *producer* side: one Cast per
  (producer output port, direction), shared by every consumer that needs it, so a tensor
  read by ten float32 consumers is cast once, not ten times.
- Name-preserving mode (graph bodies only): a node whose output becomes half moves to
  ``<name>/tf_amp_half`` and its original name is taken by a Cast back to float32 (one output)
  or an IdentityN of per-port casts (several outputs). Every original tensor name therefore
  keeps its dtype and a TF1 Session can feed and fetch by the old names; control dependencies
  on the old name still order after the op.
- Function bodies: ``ret`` values and ``_Arg`` reads are fixed-typed boundaries; casts land
  inside the body, so signatures (and every call site) stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tf_amp.painter import ALLOW_C, Painting
from tf_amp.type_attrs import (
    DT_FLOAT,
    DT_FLOAT_REF,
    DT_HALF,
    EXCLUDE_ATTR,
    FLOAT32_VIEW,
    RETVAL_OP,
    UNKNOWN_DTYPE,
    BodyView,
)

# Casts fed by these are not counted as "casts to half", as TensorFlow counts: they are free
# after constant folding, or unavoidable (variables are float32 master weights).
CONST_OPS: frozenset[str] = frozenset({"Const", "HostConst"})
VARIABLE_OPS: frozenset[str] = frozenset(
    {
        "Variable",
        "VariableV2",
        "AutoReloadVariable",
        "VarHandleOp",
        "ReadVariableOp",
        "_VarHandlesOp",
        "_ReadVariablesOp",
    }
)


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


def _suffix(target: int) -> str:
    return "Fp16" if target == DT_HALF else "Bf16"


class _Names:
    """Fresh node names that collide with nothing in the body (deterministic)."""

    def __init__(self, taken: dict[str, int]) -> None:
        self.taken = taken
        self.extra: set[str] = set()

    def fresh(self, base: str) -> str:
        name = base
        k = 0
        while name in self.taken or name in self.extra:
            k += 1
            name = f"{base}_{k}"
        self.extra.add(name)
        return name


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
    plan = CastPlan()
    colour = painting.colour
    names = _Names(view.index)
    is_function = view.is_function
    new_nodes = container.node_def if is_function else container.node
    preserve_names = preserve_names and not is_function

    # Which nodes move to a new name (name-preserving mode), decided on pre-change dtypes.
    renamed: dict[int, str] = {}
    out_dtypes: dict[int, list[int]] = {}
    if preserve_names:
        for n in range(view.num_real):
            outs = view.out_v[n]
            if not any(v >= 0 and colour[v] == ALLOW_C for v in outs):
                continue
            dtypes = [view.port_dtype(n, p, output=True) for p in range(len(outs))]
            if UNKNOWN_DTYPE in dtypes:
                continue  # cannot rebuild every port under the old name: keep it in place
            out_dtypes[n] = dtypes
            renamed[n] = names.fresh(f"{view.names[n]}/tf_amp_{_suffix(target).lower()}")
    # A Switch's untaken output is dead, and so is anything that reads it, an IdentityN of
    # both ports included: its float32 view must be a Switch too. The original node, kept
    # as it was, is one: every tensor it reads keeps its name and float32 dtype here.
    float_switches = {
        n: _copy_node(view.protos[n]) for n in renamed if view.ops[n] in _DEAD_OUTPUT_OPS
    }

    # 1. attrs
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
        plan.type_attrs_converted += 1

    e_src, e_sport, e_dst, e_dport = view.e_src, view.e_sport, view.e_dst, view.e_dport
    out_v, in_v = view.out_v, view.in_v

    # 1b. optional: a float32 Const read only by half consumers becomes a half Const in place
    folded: set[int] = set()
    if fold_constant_casts and not preserve_names:
        folded = _fold_consts_in_place(view, painting, target)
        plan.consts_folded += len(folded)
        plan.folded_nodes = frozenset(folded)

    # 2. casts at colour boundaries
    casts: dict[tuple[int, int], str] = {}
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
                _set_input(view, container, d, view.e_pos[k], _graph_ref(renamed[s], p))
            if src_allow == dst_allow or src_allow:
                continue  # float consumers keep "name:p": the Cast/IdentityN there is float
        if src_allow == dst_allow or s in folded:
            continue
        if not src_allow and sv < 0:
            dtype = view.port_dtype(s, p, output=True)
            if dtype not in (DT_FLOAT, DT_FLOAT_REF, UNKNOWN_DTYPE):
                continue  # not a float tensor (inconsistent graph): leave the edge alone
        key = (s, p)
        ref = casts.get(key)
        if ref is None:
            if s in renamed:
                src_text = _graph_ref(renamed[s], p)
            else:
                src_text = view.edge_text(k, container if is_function else None)
            ref = _add_cast(
                view, plan, names, new_nodes, s, p, src_text, to_half=dst_allow, target=target
            )
            casts[key] = ref
        _set_input(view, container, d, view.e_pos[k], ref)

    # 3. name-preserving: the old name becomes a float32 view of the half op
    for n, new_name in renamed.items():
        old = view.names[n]
        proto = view.protos[n]
        proto.name = new_name
        plan.renamed[old] = new_name
        dtypes = out_dtypes[n]
        outs = out_v[n]
        # The float32 view is marked: a later rewrite (e.g. at O2) must not paint it.
        if n in float_switches:
            original = new_nodes.add()
            original.CopyFrom(float_switches[n])
            original.attr[EXCLUDE_ATTR].s = FLOAT32_VIEW
            continue
        if len(outs) == 1:
            view_node = _cast_node(new_nodes, old, new_name, target, DT_FLOAT, proto.device)
            view_node.attr[EXCLUDE_ATTR].s = FLOAT32_VIEW
            plan.casts_to_float += 1
            continue
        identity = new_nodes.add()
        identity.name = old
        identity.op = "IdentityN"
        identity.attr[EXCLUDE_ATTR].s = FLOAT32_VIEW
        if proto.device:
            identity.device = proto.device
        for p, v in enumerate(outs):
            src = _graph_ref(new_name, p)
            if v >= 0 and colour[v] == ALLOW_C:
                cast_name = names.fresh(f"{old}-{p}-CastToFp32-tf_amp")
                _cast_node(new_nodes, cast_name, src, target, DT_FLOAT, proto.device)
                plan.casts_to_float += 1
                src = cast_name
            identity.input.append(src)
        identity.attr["T"].list.type.extend(dtypes)
    return plan


def _graph_ref(name: str, port: int) -> str:
    return name if port == 0 else f"{name}:{port}"


# Ops whose outputs are live or dead one by one (control flow): see float_switches.
_DEAD_OUTPUT_OPS = frozenset({"Switch", "RefSwitch", "_SwitchN"})


def _copy_node(proto: Any) -> Any:
    copy = type(proto)()
    copy.CopyFrom(proto)
    return copy


def _set_input(view: BodyView, container: Any, node: int, position: int, ref: str) -> None:
    """Point input ``position`` of ``node`` (index into NodeDef.input) at ``ref``."""
    if node < view.num_real:
        view.protos[node].input[position] = ref
    elif view.ops[node] == RETVAL_OP:
        key = view.ret_keys[node - (len(view.names) - len(view.ret_keys))]
        container.ret[key] = ref


def _cast_node(nodes: Any, name: str, src: str, src_t: int, dst_t: int, device: str) -> Any:
    cast = nodes.add()
    cast.name = name
    cast.op = "Cast"
    cast.input.append(src)
    if device:
        cast.device = device
    cast.attr["SrcT"].type = src_t
    cast.attr["DstT"].type = dst_t
    cast.attr["Truncate"].b = False
    return cast


def _add_cast(
    view: BodyView,
    plan: CastPlan,
    names: _Names,
    new_nodes: Any,
    s: int,
    p: int,
    src_text: str,
    to_half: bool,
    target: int,
) -> str:
    src_op = view.ops[s]
    device = view.devices[s]
    if to_half:
        plan.casts_to_half_total += 1
        if src_op not in CONST_OPS and src_op not in VARIABLE_OPS and not _reads_ref(view, s):
            plan.casts_to_half += 1
        base = f"{view.names[s]}-{p}-CastTo{_suffix(target)}-tf_amp"
        src_t, dst_t = DT_FLOAT, target
    else:
        plan.casts_to_float += 1
        base = f"{view.names[s]}-{p}-CastToFp32-tf_amp"
        src_t, dst_t = target, DT_FLOAT
    name = names.fresh(base)
    _cast_node(new_nodes, name, src_text, src_t, dst_t, device)
    return f"{name}:y:0" if view.is_function else name


def _fold_consts_in_place(view: BodyView, painting: Painting, target: int) -> set[int]:
    """Float32 Consts whose every data consumer is half: rewrite their value to half.

    Saves the Cast op and half the constant's bytes in the GraphDef. Only Consts that nothing
    float32 reads (and that are not preserved) qualify, so no reader sees a changed dtype.
    """
    colour = painting.colour
    candidates: dict[int, bool] = {}
    for k in range(len(view.e_src)):
        s = view.e_src[k]
        if view.ops[s] not in CONST_OPS or candidates.get(s) is False:
            continue
        dvs = view.in_v[view.e_dst[k]]
        q = view.e_dport[k]
        dv = dvs[q] if q < len(dvs) else -1
        candidates[s] = candidates.get(s, True) and dv >= 0 and colour[dv] == ALLOW_C
    folded: set[int] = set()
    for s, all_half in candidates.items():
        proto = view.protos[s]
        if not all_half or painting.node_block[s] == "preserved":
            continue
        if proto.attr["dtype"].type != DT_FLOAT:
            continue
        if not _tensor_to_half(proto.attr["value"].tensor, target):
            continue
        proto.attr["dtype"].type = target
        folded.add(s)
    return folded


def _half_numpy_dtype(target: int) -> Any:
    if target == DT_HALF:
        return np.float16
    from tf_amp._upstream.tensorflow import dtypes

    return dtypes.bfloat16.as_numpy_dtype


def _tensor_to_half(tensor: Any, target: int) -> bool:
    """Re-encode a float32 TensorProto as ``target`` in place; False if not possible.

    Works on the two encodings TensorFlow writes (``tensor_content`` bytes, or ``float_val``
    for scalars and splats) with numpy directly: ``make_tensor_proto`` costs ~70 us a call,
    too slow for graphs with tens of thousands of Consts.
    """
    if tensor.dtype != DT_FLOAT:
        return False
    half = _half_numpy_dtype(target)
    if tensor.tensor_content:
        values = np.frombuffer(tensor.tensor_content, dtype="<f4")
        tensor.tensor_content = values.astype(half).view("<u2").tobytes()
    else:  # float_val (empty for a zero-filled Const: nothing to convert)
        bits = np.asarray(tensor.float_val, dtype=np.float32).astype(half).view(np.uint16)
        del tensor.float_val[:]
        tensor.half_val.extend(int(b) for b in bits)
    tensor.dtype = target
    return True


def _reads_ref(view: BodyView, s: int) -> bool:
    """Identity / Enter of a ref variable (TensorFlow does not count those casts either)."""
    seen = 0
    while s < view.num_real and view.ops[s] in ("Identity", "Enter") and seen < 64:
        inputs = view.protos[s].input
        if not inputs:
            return False
        src = view.index.get(inputs[0].split(":")[0].lstrip("^"))
        if src is None:
            return False
        if view.ops[src] in ("Variable", "VariableV2"):
            return True
        s = src
        seen += 1
    return False
