"""The four op lists (allow / infer / clear / deny) as data, with environment overrides.

Why lists: a mixed-precision rewrite has to know, per op type, whether running it in half
precision is *worth it* (allow: tensor-core matmuls and convolutions), *safe unless fed by
something dangerous* (infer: elementwise arithmetic), *numerically irrelevant* (clear: data
movement), or *dangerous* (deny: exponentials and large reductions). The defaults mirror
TensorFlow's own pass (``auto_mixed_precision_lists.h``) so that models behave the same under
tf_amp as under the NVIDIA container.

Every environment override TensorFlow and NVIDIA ever documented is honoured here, and only
here (``OpLists.from_env``): the ``..._ADD`` / ``..._REMOVE`` variables for the new names, the
legacy WHITELIST / GRAYLIST / BLACKLIST aliases and NVIDIA's ``TF_AMP_*`` short forms.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

logger = logging.getLogger("tf_amp")

ALLOW = "allow"
INFER = "infer"
CLEAR = "clear"
DENY = "deny"
LIST_NAMES: tuple[str, ...] = (ALLOW, INFER, CLEAR, DENY)

_TENSOR_LIST_OPS: frozenset[str] = frozenset(
    {
        "TensorListConcat",
        "TensorListConcatLists",
        "TensorListConcatV2",
        "TensorListGather",
        "TensorListGetItem",
        "TensorListPopBack",
        "TensorListPushBack",
        "TensorListPushBackBatch",
        "TensorListFromTensor",
        "TensorListScatter",
        "TensorListScatterV2",
        "TensorListScatterIntoExistingList",
        "TensorListSetItem",
        "TensorListSplit",
        "TensorListStack",
    }
)

FP16_ALLOW: frozenset[str] = frozenset(
    {
        "BatchMatMul",
        "BatchMatMulV2",
        "BatchMatMulV3",
        "BlockLSTM",
        "BlockLSTMV2",
        "BlockLSTMGrad",
        "BlockLSTMGradV2",
        "Conv2D",
        "Conv2DBackpropFilter",
        "Conv2DBackpropInput",
        "Conv3D",
        "Conv3DBackpropFilter",
        "Conv3DBackpropFilterV2",
        "Conv3DBackpropInput",
        "Conv3DBackpropInputV2",
        "CudnnRNN",
        "CudnnRNNBackprop",
        "CudnnRNNBackpropV2",
        "CudnnRNNBackpropV3",
        "CudnnRNNV2",
        "CudnnRNNV3",
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropFilter",
        "DepthwiseConv2dNativeBackpropInput",
        "Einsum",
        "FusedConv2DBiasActivation",
        "FusedSparseConvGpuV2",
        "GRUBlockCell",
        "GRUBlockCellGrad",
        "LSTMBlockCell",
        "LSTMBlockCellGrad",
        "MatMul",
        "Mha",
        "MhaV2",
        "Tmlp",
        "TmlpV2",
        "TmlpV3",
        "Pmlp",
        "FastUnsortedSegmentMax",
    }
)

FP16_INFER: frozenset[str] = frozenset(
    {
        "Add",
        "AddN",
        "AddV2",
        "AvgPool",
        "AvgPool3D",
        "AvgPool3DGrad",
        "AvgPoolGrad",
        "BiasAdd",
        "BiasAddGrad",
        "BiasAddV1",
        "Elu",
        "EluGrad",
        "Erf",
        "Erfc",
        "FloorDiv",
        "FusedBatchNormV2",
        "FusedBatchNormGradV2",
        "FusedBatchNormV3",
        "FusedBatchNormGradV3",
        "_FusedBatchNormEx",
        "Inv",
        "LeakyRelu",
        "LeakyReluGrad",
        "Log",
        "Log1p",
        "LogSoftmax",
        "Mul",
        "Prod",
        "RealDiv",
        "Reciprocal",
        "Selu",
        "SeluGrad",
        "Sigmoid",
        "SigmoidGrad",
        "Softmax",
        "Softplus",
        "SoftplusGrad",
        "Softsign",
        "SoftsignGrad",
        "Sqrt",
        "Sub",
        "Tanh",
        "TanhGrad",
    }
)

FP16_DENY: frozenset[str] = frozenset(
    {
        "Exp",
        "Expm1",
        "L2Loss",
        "Mean",
        "Pow",
        "SaveV2",
        "SoftmaxCrossEntropyWithLogits",
        "SparseSoftmaxCrossEntropyWithLogits",
        "Sum",
    }
)

FP16_CLEAR: frozenset[str] = frozenset(
    {
        "Abs",
        "ArgMax",
        "ArgMin",
        "BatchToSpace",
        "BatchToSpaceND",
        "BroadcastTo",
        "Ceil",
        "CheckNumerics",
        "ClipByValue",
        "Concat",
        "ConcatV2",
        "DepthToSpace",
        "DynamicPartition",
        "DynamicStitch",
        "Enter",
        "EnsureShape",
        "Equal",
        "Exit",
        "ExpandDims",
        "Fill",
        "Floor",
        "Gather",
        "GatherNd",
        "GatherV2",
        "Greater",
        "GreaterEqual",
        "Identity",
        "IdentityN",
        "IsFinite",
        "IsInf",
        "IsNan",
        "Less",
        "LessEqual",
        "Max",
        "MaxPool",
        "MaxPool3D",
        "MaxPool3DGrad",
        "MaxPool3DGradGrad",
        "MaxPoolGrad",
        "MaxPoolGradGrad",
        "MaxPoolGradGradV2",
        "MaxPoolGradV2",
        "MaxPoolV2",
        "Maximum",
        "Merge",
        "Min",
        "Minimum",
        "MirrorPad",
        "MirrorPadGrad",
        "Neg",
        "NextIteration",
        "NotEqual",
        "OneHot",
        "OnesLike",
        "Pack",
        "Pad",
        "PadV2",
        "PreventGradient",
        "Rank",
        "Relu",
        "Relu6",
        "Relu6Grad",
        "ReluGrad",
        "Reshape",
        "ResizeNearestNeighbor",
        "ResizeNearestNeighborGrad",
        "Reverse",
        "ReverseSequence",
        "ReverseV2",
        "Round",
        "Select",
        "SelectV2",
        "Shape",
        "ShapeN",
        "Sign",
        "Size",
        "Slice",
        "Snapshot",
        "SpaceToBatch",
        "SpaceToBatchND",
        "SpaceToDepth",
        "Split",
        "SplitV",
        "Squeeze",
        "StopGradient",
        "StridedSlice",
        "StridedSliceGrad",
        "Switch",
        "Tile",
        "TopK",
        "TopKV2",
        "Transpose",
        "Unpack",
        "Where",
        "ZerosLike",
    }
    | _TENSOR_LIST_OPS
)

# bfloat16 lists: TensorFlow 2.21's oneDNN pass (``auto_mixed_precision_onednn_bfloat16``,
# AutoMixedPrecisionListsMkl), checked against that pass on this project's training graphs
# (tests/test_differential_bf16.py). bfloat16 keeps float32's exponent range, so the reductions
# float16 must keep in float32 (Mean, Sum) and the small ops Keras 3's BatchNormalization is
# built from (Rsqrt, Square, SquaredDifference) may follow their inputs: keeping them float32
# put a Cast into and out of every convolution of a ResNet-50.
BF16_ALLOW: frozenset[str] = frozenset(
    {
        "BatchMatMul",
        "BatchMatMulV2",
        "BatchMatMulV3",
        "Conv2D",
        "Conv2DBackpropFilter",
        "Conv2DBackpropInput",
        "Conv3D",
        "Conv3DBackpropFilterV2",
        "Conv3DBackpropInputV2",
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropFilter",
        "DepthwiseConv2dNativeBackpropInput",
        "Einsum",
        "MatMul",
    }
)

BF16_INFER: frozenset[str] = FP16_INFER | frozenset(
    {"Mean", "Rsqrt", "Square", "SquaredDifference", "Sum"}
)

BF16_DENY: frozenset[str] = FP16_DENY - {"Mean", "Sum"}

BF16_CLEAR: frozenset[str] = FP16_CLEAR | frozenset({"ResizeBilinear", "ScatterNd"})

ENV_PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"
LEVEL_ENV = ENV_PREFIX + "LEVEL"
LEVELS: tuple[str, ...] = ("", "TENSOR_CORES_ONLY", "TREAT_INFER_AS_DENY", "UNSAFE_FORCE_ALL")

# (environment variable stem, list it edits). Legacy names first so that the modern names win
# when both add and remove the same op.
_ENV_STEMS: tuple[tuple[str, str], ...] = (
    (ENV_PREFIX + "WHITELIST", ALLOW),
    (ENV_PREFIX + "GRAYLIST", INFER),
    (ENV_PREFIX + "BLACKLIST", DENY),
    ("TF_AMP_ALLOWLIST", ALLOW),
    ("TF_AMP_INFERLIST", INFER),
    ("TF_AMP_CLEARLIST", CLEAR),
    ("TF_AMP_DENYLIST", DENY),
    (ENV_PREFIX + "ALLOWLIST", ALLOW),
    (ENV_PREFIX + "INFERLIST", INFER),
    (ENV_PREFIX + "CLEARLIST", CLEAR),
    (ENV_PREFIX + "DENYLIST", DENY),
)


def list_env_variables() -> tuple[str, ...]:
    """Every environment variable that edits a list (for docs, tests and error messages)."""
    return tuple(f"{stem}_{verb}" for stem, _ in _ENV_STEMS for verb in ("ADD", "REMOVE"))


@functools.lru_cache(maxsize=1)
def registered_op_names() -> frozenset[str]:
    """All op names in TensorFlow's registry (cached: the registry only grows by loading
    libraries, and a stale cache can only produce a spurious warning)."""
    from tensorflow.core.framework import op_def_pb2

    from tf_amp._upstream.tensorflow import pywrap_tf_session as c_api

    buf = c_api.TF_GetAllOpList()
    try:
        op_list = op_def_pb2.OpList()
        op_list.ParseFromString(c_api.TF_GetBuffer(buf))
    finally:
        c_api.TF_DeleteBuffer(buf)
    return frozenset(op.name for op in op_list.op)


def split_op_names(value: str) -> list[str]:
    """Split a comma-separated env value; blanks (``"A,,B, "``) are ignored, as users expect."""
    return [part.strip() for part in value.split(",") if part.strip()]


@dataclass(frozen=True)
class OpLists:
    """Four disjoint sets of op type names. Construct with ``OpLists.default()`` or
    ``OpLists.from_env()``; direct construction validates disjointness.

    >>> lists = OpLists.default()
    >>> lists.category("MatMul")
    'allow'
    """

    allow: frozenset[str]
    infer: frozenset[str]
    clear: frozenset[str]
    deny: frozenset[str]

    def __post_init__(self) -> None:
        for name in LIST_NAMES:
            object.__setattr__(self, name, frozenset(getattr(self, name)))
        seen: dict[str, str] = {}
        for name in LIST_NAMES:
            for op in sorted(getattr(self, name)):
                if op in seen:
                    raise ValueError(
                        f"Op {op!r} is on both the {seen[op]} list and the {name} list; an op "
                        f"must be on at most one list (remove it from one of them, e.g. with "
                        f"{ENV_PREFIX}{seen[op].upper()}LIST_REMOVE={op})."
                    )
                seen[op] = name
        object.__setattr__(self, "_category", seen)

    def category(self, op: str) -> str | None:
        """The list ``op`` is on, or None (ops on no list stay float32)."""
        return self._category.get(op)  # type: ignore[attr-defined]

    def as_dict(self) -> dict[str, list[str]]:
        """Sorted plain data, for logs and JSON."""
        return {name: sorted(getattr(self, name)) for name in LIST_NAMES}

    @classmethod
    def default(cls, target_dtype: str = "float16") -> OpLists:
        """TensorFlow's default lists for ``target_dtype`` ("float16" or "bfloat16")."""
        if target_dtype not in ("float16", "bfloat16"):
            raise ValueError(f"target_dtype must be 'float16' or 'bfloat16', got {target_dtype!r}")
        if target_dtype == "float16":
            return cls(allow=FP16_ALLOW, infer=FP16_INFER, clear=FP16_CLEAR, deny=FP16_DENY)
        return cls(allow=BF16_ALLOW, infer=BF16_INFER, clear=BF16_CLEAR, deny=BF16_DENY)

    def with_level(self, level: str) -> OpLists:
        """Apply TensorFlow's ``..._LEVEL``: TENSOR_CORES_ONLY keeps only the allow list;
        TREAT_INFER_AS_DENY moves infer ops to deny; UNSAFE_FORCE_ALL is handled by the
        painter (it paints everything) and leaves the lists alone."""
        level = level.upper()
        if level not in LEVELS:
            raise ValueError(f"{LEVEL_ENV} must be one of {LEVELS[1:]} or empty, got {level!r}")
        if level == "TENSOR_CORES_ONLY":
            return OpLists(self.allow, frozenset(), frozenset(), frozenset())
        if level == "TREAT_INFER_AS_DENY":
            return OpLists(self.allow, frozenset(), self.clear, self.deny | self.infer)
        return self

    def with_edits(self, edits: Iterable[tuple[str, ...]]) -> OpLists:
        """Apply ``(list_name, "ADD"|"REMOVE", op[, source])`` edits in order.

        Adding an op moves it off the default list it was on (so ``ALLOWLIST_ADD=Mul`` just
        works, where TensorFlow would crash on "op in multiple lists"); adding the same op to
        two lists in the same edit set is the user's contradiction and an error, which names
        the two ``source``s (the environment variables) when given.
        """
        sets = {name: set(getattr(self, name)) for name in LIST_NAMES}
        added: dict[str, tuple[str, str]] = {}  # op -> (list, source) of its ADD
        for list_name, verb, op, *source in edits:
            where = f" ({source[0]})" if source else ""
            if verb == "ADD":
                if op in added and added[op][0] != list_name:
                    first_list, first_where = added[op]
                    raise ValueError(
                        f"Op {op!r} is added to both the {first_list} list{first_where} and the "
                        f"{list_name} list{where}; choose one."
                    )
                added[op] = (list_name, where)
                for other in LIST_NAMES:
                    sets[other].discard(op)
                sets[list_name].add(op)
            else:
                sets[list_name].discard(op)
        return OpLists(**{name: frozenset(values) for name, values in sets.items()})

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        target_dtype: str = "float16",
        base: OpLists | None = None,
        apply_level: bool = True,
    ) -> OpLists:
        """Defaults (or ``base``) edited by every list variable set in ``environ``.

        Names that TensorFlow has no op for are kept (custom ops may be loaded later) but
        warned about with the closest registered names, because a typo here otherwise fails
        silently.
        """
        env = os.environ if environ is None else environ
        lists = base if base is not None else cls.default(target_dtype)
        edits: list[tuple[str, str, str, str]] = []
        for stem, list_name in _ENV_STEMS:
            for verb in ("ADD", "REMOVE"):
                var = f"{stem}_{verb}"
                for op in split_op_names(env.get(var, "")):
                    _warn_if_unknown(op, var)
                    edits.append((list_name, verb, op, var))
        lists = lists.with_edits(edits)
        level = env.get(LEVEL_ENV, "").strip()
        if level.upper() not in LEVELS:
            raise ValueError(f"{LEVEL_ENV} must be one of {LEVELS[1:]} or empty, got {level!r}")
        return lists.with_level(level) if apply_level else lists


def _warn_if_unknown(op: str, variable: str) -> None:
    names = registered_op_names()
    if op in names:
        return
    close = difflib.get_close_matches(op, sorted(names), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    logger.warning("%s names op %r, which TensorFlow has not registered%s", variable, op, hint)
