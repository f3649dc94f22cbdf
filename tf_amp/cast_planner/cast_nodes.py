"""The Cast nodes the planner adds: their names, their attrs, and which of them count.

Names are ``<producer>-<port>-CastTo{Fp16,Bf16,Fp32}-tf_amp`` (numbered on a clash): a reader of
the rewritten graph sees which tensor each Cast converts, and the names are deterministic, so
the same input gives the same bytes.

Counting follows TensorFlow's summary line: a cast to half fed by a constant, a variable read or
an Identity/Enter of a ref variable is not counted (free after constant folding, or unavoidable:
variables are float32 master weights).
"""

from __future__ import annotations

from typing import Any

from tf_amp.cast_planner.const_folding import CONST_OPS
from tf_amp.type_attrs import DT_HALF, BodyView

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


def suffix(target: int) -> str:
    """"Fp16" or "Bf16": the target's part of a Cast's name."""
    return "Fp16" if target == DT_HALF else "Bf16"


class CastNames:
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


def graph_ref(name: str, port: int) -> str:
    """A graph-body input string for output ``port`` of node ``name``."""
    return name if port == 0 else f"{name}:{port}"


def cast_node(nodes: Any, name: str, src: str, src_t: int, dst_t: int, device: str) -> Any:
    """Appends a ``Cast`` from ``src_t`` to ``dst_t`` reading ``src`` to ``nodes``."""
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


def counts_as_cast_to_half(view: BodyView, s: int) -> bool:
    """Whether a cast to half of node ``s``'s output counts in TensorFlow's summary line."""
    src_op = view.ops[s]
    return src_op not in CONST_OPS and src_op not in VARIABLE_OPS and not reads_ref(view, s)


def reads_ref(view: BodyView, s: int) -> bool:
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
