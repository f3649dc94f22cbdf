"""Whether a vertex may turn to the 16-bit target: its OpDef allows it, and a kernel exists.

A registered kernel is checked, not assumed: an op whose OpDef allows half but that has no
half kernel on the node's device would fail at run time ("no OpKernel registered"). Kernel
tables come from TensorFlow's registry once per (op, device type); answers are cached per
(op, device, attr, element, current type signature) across bodies and rewrites, and per vertex
in ``HalfSupport.f16`` (the report reads that cache back).
"""

from __future__ import annotations

from typing import Any

from tf_amp._upstream.tensorflow import kernels
from tf_amp.config import RewriteConfig
from tf_amp.type_attrs import BodyView, device_type

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


def kernel_takes(op: str, dev: str, values: dict[str, Any]) -> bool:
    """Whether some kernel of ``op`` on device type ``dev`` takes these type attr values
    (``{attr: dtype enum or tuple of them}``): the rewrite's kernel check, and the probe's."""
    return any(_satisfies(constraints, values) for constraints in _kernel_constraints(op, dev))


class HalfSupport:
    """Answers "may vertex ``v`` hold the target type?" for one body, caching per vertex.

    ``f16[v]``: 0 not asked yet, 1 supported, 2 not supported.
    """

    def __init__(self, view: BodyView, config: RewriteConfig, target: int) -> None:
        self.view = view
        self.config = config
        self.target = target
        self.f16 = bytearray(view.num_vertices)

    def supports_half(self, v: int) -> bool:
        """OpDef allows the target type for this attr, and (unless disabled) a kernel with it
        is registered for the node's device type. Cached per (op, device, attr, types)."""
        state = self.f16[v]
        if state:
            return state == 1
        ok = self._supports_half_uncached(v)
        self.f16[v] = 1 if ok else 2
        return ok

    def opdef_allows_half(self, v: int) -> bool:
        """The OpDef alone allows the target for this attr (no kernel check): what
        TensorFlow's pass 4 asks before following allow into an infer op."""
        info = self.view.infos[self.view.v_node[v]]
        if info is None:
            return False
        allowed = info.allowed.get(self.view.v_attr[v])
        return allowed is None or self.target in allowed

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
        ok = kernel_takes(view.ops[n], dev, values)
        _KERNEL_CHECK[key] = ok
        return ok


def _satisfies(constraints: list[tuple[str, frozenset[int]]], values: dict[str, Any]) -> bool:
    """Whether the node's type attrs (one turned to the target) meet one kernel's constraints;
    a constraint on an attr the node does not set is ignored."""
    for cname, allowed_types in constraints:
        value = values.get(cname)
        if value is None:
            continue
        if isinstance(value, tuple):
            if not all(t in allowed_types for t in value):
                return False
        elif value not in allowed_types:
            return False
    return True
