"""Which nodes may change at all, and which op list each vertex's op is on.

A node is *eligible* unless something outside numerics pins its dtype: a feed or fetch the
caller preserves, an op the probe measured slower in the target, state (constants, variables,
checkpoints, transfers), an op whose dtype is what it computes, a function call (its body is
rewritten instead), an excluded name scope or ``_tf_amp_exclude`` attr, a node on the wrong
device, an op TensorFlow does not know, the cancelling sum of a normalization (float16's
default), arithmetic that only updates variables (bfloat16's default), a gather or slice of a
weight table (the Cast goes after it), a Keras model's compiled loss, a loop's running sum, an
op that scales by a constant beyond the target's range. The reason is kept per
node (``node_block``, a ``Block``) so the report can say it in words. Gradient ops of an
excluded region are excluded with it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from tf_amp.config import RewriteConfig
from tf_amp.lists import OpLists
from tf_amp.painter.colours import CAT_NONE, CATEGORY_OF_LIST
from tf_amp.painter.half_range import readers_of_constants_beyond_range
from tf_amp.painter.loss_guard import compiled_loss_nodes
from tf_amp.painter.normalization_guard import normalization_sum_nodes
from tf_amp.painter.reasons import Block
from tf_amp.painter.table_selection import table_selection_nodes
from tf_amp.painter.update_guard import update_only_nodes
from tf_amp.type_attrs import (
    DT_BFLOAT16,
    DT_HALF,
    EXCLUDE_NOT_READ,
    EXCLUDE_USER,
    EXCLUDE_VIEW,
    BodyView,
    device_type,
    exclude_mark,
)
from tf_amp.type_attrs.exclude import (
    called_functions,
    gradient_functions,
    is_gradient_of,
    scope_test,
)

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

# Name prefixes of gradient ops: TF2 tapes and TF1 tf.gradients (gradients, gradients_1, ...).


def list_categories(view: BodyView, lists: OpLists) -> bytearray:
    """Per vertex, the category (``CAT_*``) of the list its op is on; looked up once per op."""
    category = lists.category
    cat = bytearray(view.num_vertices)
    op_cat: dict[str, int] = {}
    for v, n in enumerate(view.v_node):
        op = view.ops[n]
        c = op_cat.get(op)
        if c is None:
            c = CATEGORY_OF_LIST.get(category(op) or "", CAT_NONE)
            op_cat[op] = c
        cat[v] = c
    return cat


def node_eligibility(
    view: BodyView,
    config: RewriteConfig,
    lists: OpLists,
    preserve: frozenset[str],
    slow: frozenset[str],
    body_excluded: bool = False,
) -> tuple[bytearray, list[str]]:
    """(per node: 1 if it may change, per node: the ``Block`` saying why not, "" if it may).

    Pseudo-nodes (``_Arg``/``_Retval``) are never eligible: they are the function boundary.
    ``body_excluded``: the body is a function that an excluded node calls
    (:func:`functions_called_from_excluded_nodes`), so every node in it is excluded.
    """
    node_eligible = bytearray(len(view.names))
    node_block = [""] * len(view.names)
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
        block: str = ""
        if info is None:
            block = Block.UNKNOWN_OP
        elif name in preserve:
            block = Block.PRESERVED
        elif name in slow:
            block = Block.MEASURED_SLOW
        elif op in PINNED_OPS or info.touches_state:
            block = Block.STATE
        elif op in DTYPE_BOUND_OPS:
            block = Block.DTYPE_BOUND
        elif op == "IdentityN" and _marks_a_saved_custom_gradient(view, n):
            block = Block.CUSTOM_GRADIENT
        elif info.is_function or info.has_func_attr:
            block = Block.FUNCTION
        elif body_excluded or (prefixes and (name in scope_set or name.startswith(prefixes))):
            block = Block.EXCLUDED
        elif gpu_only and device_type(view.devices[n], default_dev) != "GPU":
            block = Block.DEVICE
        else:
            mark = exclude_attr[n]
            if mark == EXCLUDE_NOT_READ:
                mark = exclude_mark(view.protos[n].attr)
            if mark == EXCLUDE_USER:
                block = Block.EXCLUDED
            elif mark == EXCLUDE_VIEW:
                block = Block.FLOAT32_VIEW
        if block:
            node_block[n] = block
        else:
            node_eligible[n] = 1
    _exclude_backward_of_excluded(view, node_eligible, node_block)
    _block_guarded_nodes(view, config, lists, node_eligible, node_block)
    for n in range(view.num_real, len(view.names)):
        node_block[n] = Block.FUNCTION_BOUNDARY
    return node_eligible, node_block


def _marks_a_saved_custom_gradient(view: BodyView, n: int) -> bool:
    """True for the op marking a ``tf.custom_gradient`` whose gradient function the graph's
    library holds (a SavedModel exports it): differentiated after the rewrite, that float32
    function would get this op's half tensors. A graph traced in the process holds none
    (its gradients are built at trace time, or, under a tape outside a tf_amp function, the
    call runs float32: ``runtime.function``), and TensorFlow's pass paints the op freely."""
    if not view.saved_gradient_types:
        return False
    mark = view.protos[n].attr.get("_gradient_op_type")
    return mark is not None and mark.s.decode() in view.saved_gradient_types


def _block_guarded_nodes(
    view: BodyView,
    config: RewriteConfig,
    lists: OpLists,
    node_eligible: bytearray,
    node_block: list[str],
) -> None:
    """Keeps float32 the eligible nodes that a guard asks for, each with its ``Block``:

    - the ``x * inv + shift`` of each normalization, whose half rounding cancels to a large
      error (``tf_amp.painter.normalization_guard``);
    - the arithmetic that serves only variable updates (``tf_amp.painter.update_guard``);
    - the gathers and slices of a float32 weight table, so the Cast is of what they select
      (``tf_amp.painter.table_selection``);
    - a Keras model's compiled loss and its gradient (``tf_amp.painter.loss_guard``);
    - a loop's running sums (``tf_amp.painter.accumulator_guard``);
    - the readers of a constant beyond the target's range that would scale by it
      (``tf_amp.painter.half_range``).
    """
    guards: list[tuple[bool, Callable[[], Collection[int]], Block]] = [
        (config.guards_normalization, lambda: normalization_sum_nodes(view), Block.NORMALIZATION),
        (config.guards_updates, lambda: update_only_nodes(view, lists.allow),
         Block.VARIABLE_UPDATE),
        (config.selects_before_cast, lambda: table_selection_nodes(view), Block.TABLE_SELECTION),
        (config.guards_losses, lambda: compiled_loss_nodes(view), Block.COMPILED_LOSS),
        (config.guards_accumulators, lambda: view.running_sums, Block.LOOP_ACCUMULATOR),
        (config.guards_constant_range,
         lambda: readers_of_constants_beyond_range(
             view, DT_HALF if config.target_dtype == "float16" else DT_BFLOAT16),
         Block.CONSTANT_BEYOND_RANGE),
    ]
    for on, find_nodes, block in guards:
        if not on:
            continue
        for n in find_nodes():
            if node_eligible[n]:
                node_eligible[n] = 0
                node_block[n] = block


def _exclude_backward_of_excluded(
    view: BodyView, node_eligible: bytearray, node_block: list[str]
) -> None:
    """Keeps the gradient ops of an excluded region float32 like its forward ops.

    A region excluded by name scope or by ``_tf_amp_exclude`` (``tf_amp.keep_float32``)
    would otherwise run its backward pass in half: gradient ops carry neither the scope nor
    the attribute. They are named after the forward op they differentiate:
    ``gradient_tape/<forward op>/...`` (TF2 tapes) or ``gradients[_N]/<forward op>_grad/...``
    (TF1 ``tf.gradients``), so a gradient op whose forward path lies under an excluded node
    is excluded too.
    """
    excluded = {view.names[n] for n in range(view.num_real) if node_block[n] == Block.EXCLUDED}
    if not excluded:
        return
    for n in range(view.num_real):
        if node_eligible[n] and is_gradient_of(view.names[n], excluded):
            node_eligible[n] = 0
            node_block[n] = Block.EXCLUDED


def functions_called_from_excluded_nodes(
    views: Sequence[tuple[str, BodyView]],
    config: RewriteConfig,
    backward_of: Mapping[str, str] | None = None,
) -> frozenset[str]:
    """Names of the functions whose every node is excluded: those an excluded node calls (a
    ``While`` / ``If`` / function call made under ``tf_amp.keep_float32`` or in an excluded
    scope, or the gradient of one), and, transitively, every function they call.

    The exclusion marks only the nodes built in the excluded region's own graph, and a scope
    names only the nodes of its own body: a loop body, a branch or a nested ``tf.function``
    is traced into a graph of its own, and was painted as if nothing excluded it (``inf``
    where the user kept float32). A function called from both inside and outside an excluded
    region is one body: it is kept float32 for both. ``backward_of`` maps a forward function
    to the backward function a tape made of it (called by a node named after nothing
    excluded): excluded with it.
    """
    backward_of = backward_of or {}
    in_scope = scope_test(config.exclude_scopes)
    bodies = {body for body, _ in views if body}
    calls: dict[str, set[str]] = {}
    pending: list[str] = []
    for body, view in views:
        excluded_names = set()
        callers: list[tuple[int, set[str]]] = []
        for n in range(view.num_real):
            name = view.names[n]
            mark = view.exclude_attr[n]
            if mark == EXCLUDE_NOT_READ:
                mark = exclude_mark(view.protos[n].attr)
            if mark == EXCLUDE_USER or (in_scope is not None and in_scope(name)):
                excluded_names.add(name)
            info = view.infos[n]
            if info is not None and (info.is_function or info.has_func_attr):
                callers.append((n, set(called_functions(view.protos[n], bodies))))
        calls[body] = set().union(*(callees for _, callees in callers))
        for n, callees in callers:
            if view.names[n] in excluded_names or is_gradient_of(view.names[n], excluded_names):
                pending.extend(callees)
    gradients = gradient_functions(bodies)
    excluded: set[str] = set()
    while pending:
        function = pending.pop()
        if function not in excluded:
            excluded.add(function)
            pending.extend(calls.get(function, ()))
            pending.extend(gradients.get(function, ()))
            if function in backward_of:
                pending.append(backward_of[function])
    return frozenset(excluded)
