"""Selections from a weight table stay float32: the Cast goes on the rows selected, not the table.

An embedding lookup reads the whole float32 table and gathers a few rows of it. TensorFlow's
pass treats ``GatherV2`` as a clear op, so when the rows feed half ops it paints the gather half
and casts its input: the *whole* table, every step (BERT-base: 30,522 x 768 values, where a
batch of 8 x 128 tokens selects 1,024 rows). Gathering in float32 and casting what comes out
gives the same bits (a cast commutes with a selection) for a fraction of the work; Keras does
the same (its ``Embedding`` gathers from the float32 table and casts the result to its compute
dtype). (``tf.gather`` on a variable itself is a ``ResourceGather``, which reads only the
rows, in float32: nothing to do there.)

Which nodes: a ``Gather``/``GatherV2``/``GatherNd``/``Slice``/``StridedSlice`` whose float input
is a variable read (``ReadVariableOp``, or the ``Identity`` that reads a TF1 ``VariableV2``)
that nothing but such selections reads. Not when the read has another reader (a tied output
projection): that reader needs the table cast anyway, and the gather then shares the Cast for
free. A slice never selects more than its input; a gather may (a two-row token-type table
looked up for every token), so where the GraphDef records both shapes (``_output_shapes``) a
gather that selects more values than the table holds is left to the painter. Without shapes,
a gather from a variable is taken for what it nearly always is: a lookup of a batch's rows in
a bigger table.
"""

from __future__ import annotations

from typing import Any

from tf_amp.type_attrs import BodyView

SELECTION_OPS: frozenset[str] = frozenset(
    {"Gather", "GatherV2", "GatherNd", "Slice", "StridedSlice"}
)
# Selections that never produce more values than they read.
_SHRINKING_OPS: frozenset[str] = frozenset({"Slice", "StridedSlice"})
_TF1_VARIABLES: frozenset[str] = frozenset({"VariableV2", "Variable"})


def table_selection_nodes(view: BodyView) -> frozenset[int]:
    """Indices of the real nodes of ``view`` that select from a float32 variable read which
    only selections read (see the module docstring). Cheap where there is none: the edges
    are walked only when some selection reads a variable."""
    ops = view.ops
    table_of: dict[int, int] = {}  # selection -> the variable read it selects from
    for n in range(view.num_real):
        if ops[n] in SELECTION_OPS:
            read = _float_source(view, n)
            if read is not None and _is_variable_read(view, read):
                table_of[n] = read
    if not table_of:
        return frozenset()
    reads = set(table_of.values())
    only_selections = dict.fromkeys(reads, True)
    for src, dst, dport in zip(view.e_src, view.e_dst, view.e_dport, strict=True):
        if src in reads and not (dst in table_of and dport == 0):
            only_selections[src] = False
    return frozenset(
        n for n, read in table_of.items()
        if only_selections[read] and _selects_less(view, n, read)
    )


def _is_variable_read(view: BodyView, node: int) -> bool:
    """A resource variable's ``ReadVariableOp``, or the ``Identity`` reading a TF1 variable."""
    op = view.ops[node]
    if op == "ReadVariableOp":
        return True
    if op != "Identity":
        return False
    # A ref-typed variable's output is no vertex: its name is read from the NodeDef.
    inputs = view.protos[node].input
    source = view.index.get(inputs[0].split(":")[0]) if inputs else None
    return source is not None and view.ops[source] in _TF1_VARIABLES


def _float_source(view: BodyView, node: int) -> int | None:
    """The real node feeding the selection's float32 input (its data, input 0), found through
    the vertex edges; None when that input is no float32 vertex (the painter leaves it)."""
    ports = view.in_v[node]
    sources = view.fanin[ports[0]] if ports and ports[0] >= 0 else ()
    if len(sources) != 1:
        return None
    source = view.v_node[sources[0]]
    return source if source < view.num_real else None


def _selects_less(view: BodyView, node: int, read: int) -> bool:
    """Whether the selection's output is smaller than the table, as far as the GraphDef says."""
    if view.ops[node] in _SHRINKING_OPS:
        return True
    selected = _recorded_size(view.protos[node])
    table = _recorded_size(view.protos[read])
    return selected is None or table is None or selected < table


def _recorded_size(proto: Any) -> int | None:
    """Values in output 0 as recorded in ``_output_shapes``; None when unknown."""
    if "_output_shapes" not in proto.attr:
        return None
    shapes = proto.attr["_output_shapes"].list.shape
    if not shapes or shapes[0].unknown_rank:
        return None
    size = 1
    for dim in shapes[0].dim:
        if dim.size < 0:
            return None
        size *= dim.size
    return size
