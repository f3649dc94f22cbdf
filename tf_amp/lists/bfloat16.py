"""The default bfloat16 lists: TensorFlow 2.21's oneDNN pass, written as edits of float16's.

From ``auto_mixed_precision_onednn_bfloat16`` (AutoMixedPrecisionListsMkl), checked against
that pass on this project's training graphs (tests/test_differential_bf16.py). bfloat16 keeps
float32's exponent range, so the reductions float16 must keep in float32 (Mean, Sum) and the
small ops Keras 3's BatchNormalization is built from (Rsqrt, Square, SquaredDifference) may
follow their inputs: keeping them float32 put a Cast into and out of every convolution of a
ResNet-50.
"""

from __future__ import annotations

from tf_amp.lists.float16 import FP16_CLEAR, FP16_DENY, FP16_INFER

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
