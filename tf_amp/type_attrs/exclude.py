"""The node attr that keeps a node float32 whatever the lists say, and how to read it.

Set by users (``tf_amp.keep_float32``, exclude scopes in a traced function) and by the cast
planner (on the float32 view a name-preserving rewrite leaves under an op's old name). Read
while the vertex view is built, so the painter needs no second sweep over the attr maps.
"""

from __future__ import annotations

from typing import Any

EXCLUDE_ATTR = "_tf_amp_exclude"  # node attr: never convert this node
# The attr's two values: ``b=True`` is the user's (``tf_amp.keep_float32``, exclude scopes in a
# traced function), and its gradient ops are kept float32 too; ``s=FLOAT32_VIEW`` marks the
# float32 view the rewriter leaves under an op's old name in name-preserving mode, which no
# later rewrite may paint but which excludes nothing else. One attr, so telling them apart
# costs no second lookup per node.
FLOAT32_VIEW = b"float32-view"
# ``BodyView.exclude_attr`` values
EXCLUDE_NOT_READ, EXCLUDE_NONE, EXCLUDE_USER, EXCLUDE_VIEW = 0, 1, 2, 3


def exclude_mark(attrs: Any) -> int:
    """EXCLUDE_NONE / EXCLUDE_USER / EXCLUDE_VIEW for a NodeDef's attr map."""
    value = attrs.get(EXCLUDE_ATTR)
    if value is None:
        return EXCLUDE_NONE
    if value.b:
        return EXCLUDE_USER
    return EXCLUDE_VIEW if value.s == FLOAT32_VIEW else EXCLUDE_NONE
