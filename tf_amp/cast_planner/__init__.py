"""The cast planner: turn a painting into attr changes and Cast nodes, in place on a copy.

Rules (why):
- Every allow vertex's type attr becomes the target type; nothing else changes dtype.
- A Cast goes where a tensor crosses a colour boundary, at the *producer* side: one Cast per
  (producer output port, direction), shared by every consumer that needs it, so a tensor
  read by ten float32 consumers is cast once, not ten times.
- Name-preserving mode (graph bodies only): a node whose output becomes half moves to
  ``<name>/tf_amp_fp16`` (``_bf16``) and its original name is taken by a Cast back to float32
  (one output) or an IdentityN of per-port casts (several outputs). Every original tensor name
  therefore keeps its dtype and a TF1 Session can feed and fetch by the old names; control
  dependencies on the old name still order after the op.
- Function bodies: ``ret`` values and ``_Arg`` reads are fixed-typed boundaries; casts land
  inside the body, so signatures (and every call site) stay valid.

Modules: ``plan`` (``plan_and_apply`` and its steps), ``cast_nodes`` (names, attrs and counting of
the Casts it adds), ``const_folding`` (Consts turned half in place instead of cast).
"""

from __future__ import annotations

from tf_amp.cast_planner.cast_nodes import VARIABLE_OPS
from tf_amp.cast_planner.const_folding import CONST_OPS
from tf_amp.cast_planner.plan import CastPlan, plan_and_apply

__all__ = ["CONST_OPS", "VARIABLE_OPS", "CastPlan", "plan_and_apply"]
