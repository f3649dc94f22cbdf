"""Why a vertex has its colour, and why a node could not change: the codes and their words.

``Reason``: what painted (or unpainted) a vertex. Each member knows the pass that sets it (the
report's and the decisions file's ``pass``) and its words (the ``reason``), a template with the
fields ``op``, ``t`` (the target dtype), ``cause`` (the neighbour vertex that decided it), ``by``
(``" (cause)"`` or ``""``), ``op_list`` and ``level``.

``Block``: why a node was never a candidate (``Painting.node_block``), with its words (field
``op``). Members are strings, so a block compares equal to its name (``"preserved"``).

Why words live here: a user asking "why is my LayerNorm still float32?" should get an answer
like "fed by float32-only op 'Exp' through clear/infer ops, and feeds a deny/infer op", and the
code that sets a reason is the place that knows what it means.
"""

from __future__ import annotations

import enum


class Reason(enum.Enum):
    """What painted a vertex: the deciding pass and the words for it (None: never painted)."""

    pass_name: str | None
    template: str | None

    def __init__(self, pass_name: str | None, template: str | None) -> None:
        self.pass_name = pass_name
        self.template = template

    NONE = (None, None)
    ALLOW_LIST = (
        "add_allow_list_ops",
        "{op} is on the allow list: performance-critical and safe in {t}",
    )
    FORCED_LEVEL = (
        "add_allow_list_ops",
        "opt level {level} converts every op that has a {t} kernel",
    )
    DENY_LIST = (
        "propagate_deny_forward",
        "{op} is on the deny list: numerically unsafe in {t}, kept float32",
    )
    DENY_PROPAGATED = (
        "propagate_deny_forward",
        "fed (through clear/infer ops) by float32-only op {cause} and itself feeds a "
        "deny/infer op: kept float32 so the unsafe value is not rounded",
    )
    DENY_PROPAGATED_INFER = (
        "propagate_deny_forward",
        "fed (through clear/infer ops) by float32-only op {cause}: an infer op follows "
        "its inputs, kept float32 so the unsafe value is not rounded",
    )
    TENSOR_LIST_UNSAFE = (
        "find_tensor_list_clusters",
        "TensorList whose handle crosses a function, feed or control-flow boundary: "
        "the other side cannot be changed consistently, kept float32",
    )
    TENSOR_LIST_MATCH_ALLOW = (
        "force_tensor_list_colour_match",
        "TensorList sharing a handle with {t} list op {cause}: one element type",
    )
    TENSOR_LIST_MATCH_DENY = (
        "force_tensor_list_colour_match",
        "TensorList sharing a handle with float32 list op {cause}: one element type",
    )
    BETWEEN_ALLOW = (
        "add_clear_and_infer_between_allow",
        "{op_list} op lying between {t} ops (downstream and upstream of one, here {cause}): "
        "converting it saves a pair of casts",
    )
    FOLLOWS_ALLOW = (
        "add_infer_following_allow",
        "infer op fed directly by {t} op {cause} (infer_follows_allow)",
    )
    CLEAR_PROPAGATED = (
        "propagate_allow_through_clear",
        "clear op (moves data, no numeric effect) connected to {t} op {cause}",
    )
    NO_HALF_SUPPORT = (
        "remove_allow_without_half",
        "no {t} support (OpDef or kernel) for this attr: kept float32",
    )
    RECURRENT_UNPAINT = (
        "force_recurrent_edge_colour_match",
        "loop-carried value: a Merge/NextIteration partner{by} is float32",
    )
    RECURRENT_PAINT = (
        "force_recurrent_edge_colour_match",
        "loop back edge: matches the colour of its Merge {cause}",
    )
    CAST_RETARGET = (
        "retarget_casts_to_half",
        "existing Cast whose consumers are all {t}: now casts to {t} directly",
    )


class Block(str, enum.Enum):
    """Why a node may not change at all, and the words for it (None: never shown)."""

    template: str | None

    def __new__(cls, value: str, template: str | None) -> Block:
        member = str.__new__(cls, value)
        member._value_ = value
        member.template = template
        return member

    UNKNOWN_OP = (
        "unknown-op",
        "op {op} is not registered with TensorFlow: kept float32, casts at its edges",
    )
    PRESERVED = ("preserved", "node is preserved (feed/fetch): its dtype must not change")
    MEASURED_SLOW = (
        "measured-slow",
        "op {op} measured slower in the target than in float32 at its shapes on this machine "
        "(tf_amp.probe): kept float32",
    )
    STATE = ("state", "constant, feed or variable access: keeps its dtype (master weights)")
    DTYPE_BOUND = (
        "dtype-bound",
        "op {op} computes with its dtype itself (bits, bytes, Python code, counting), not just "
        "at a precision: kept float32 at every level",
    )
    CUSTOM_GRADIENT = (
        "custom-gradient",
        "marks a tf.custom_gradient whose gradient function the library holds (a "
        "SavedModel's); TensorFlow calls it with this op's dtypes when the rewritten graph "
        "is differentiated, and, written for float32, it would get half tensors: kept float32",
    )
    FUNCTION = (
        "function",
        "calls a function; its signature stays float32 (the body is rewritten)",
    )
    EXCLUDED = (
        "excluded",
        "excluded by exclude_scopes or the _tf_amp_exclude attr: kept float32",
    )
    FLOAT32_VIEW = (
        "float32-view",
        "the float32 view an earlier name-preserving rewrite left under the old name of an op "
        "it turned half: kept float32",
    )
    DEVICE = ("device", "not placed on a GPU (eligible_devices='gpu'): not processed")
    NORMALIZATION = (
        "normalization",
        "{op} of a normalization's x * inv + (offset - mean * inv): the two terms cancel, so "
        "half rounding would give a large error; kept float32 as Keras keeps its "
        "normalization layers (tf_amp.painter.normalization_guard)",
    )
    VARIABLE_UPDATE = (
        "variable-update",
        "{op} serves only variable updates (an optimizer step, moving statistics): kept "
        "float32 like the float32 state it updates (tf_amp.painter.update_guard)",
    )
    COMPILED_LOSS = (
        "compiled-loss",
        "{op} of a Keras model's loss or its gradient: kept float32, as Keras's mixed "
        "policies compute losses (1 - 1e-7, a clip bound, is 1.0 in 16 bits; "
        "tf_amp.painter.loss_guard)",
    )
    LOOP_ACCUMULATOR = (
        "loop-accumulator",
        "{op} is part of a loop's running sum (a loop variable updated from its own previous "
        "value): kept float32, as half rounding would lose each addend that falls below half "
        "a unit of the sum (tf_amp.painter.accumulator_guard)",
    )
    CONSTANT_BEYOND_RANGE = (
        "constant-beyond-range",
        "{op} reads a float32 constant beyond the target's range and is no sum, select or "
        "bound that can take it as a sentinel: kept float32, where half would scale by a "
        "clipped or infinite value (tf_amp.painter.half_range)",
    )
    TABLE_SELECTION = (
        "table-selection",
        "{op} selects from a float32 weight table: kept float32, so that half ops reading its "
        "output get a Cast of what it selects, not of the whole table every step, as with "
        "Keras's Embedding (tf_amp.painter.table_selection)",
    )
    # _Arg / _Retval pseudo-nodes: they have no vertex, so no decision ever shows these words.
    FUNCTION_BOUNDARY = ("function-boundary", None)
