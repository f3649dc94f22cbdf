"""``bench/_onednn.py``: reading ``ONEDNN_VERBOSE=1`` output, the benchmarks' proof of which
data type really ran. Lines of both formats oneDNN 3.7 prints (copied from TensorFlow 2.21
runs), and a real run's output, so a format change fails here rather than silently in a bench.
"""

from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
from _onednn import executed_primitives  # noqa: E402

# Eigen's float32 GEMM (what TensorFlow's MatMul and convolutions call with oneDNN off, and
# what they run for bfloat16 tensors after converting them), an AVX2 convolution primitive,
# a bfloat16 AMX one, lines that are not executions, and oneDNN 3.5's format.
LOG = """\
onednn_verbose,v1,info,cpu,isa:Intel AVX2
onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src_f32::blocked:ab:f0 wei_f32::blocked:ab:f0 dst_f32::blocked:ab:f0,,,120x288:288x16,0.0610352
onednn_verbose,v1,primitive,exec,cpu,gemm_api,,undef,src_f32::blocked:ab:f0 wei_f32::blocked:ab:f0 dst_f32::blocked:ab:f0,,,120x288:288x48,0.0869141
onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx2,forward_training,src:f32::blocked:acdb::f0 wei:f32::blocked:Acdb8a::f0 bia:undef::undef::: dst:f32::blocked:acdb::f0,attr-scratchpad:user,alg:convolution_direct,mb16_ic64oc64_ih32oh32kh3sh1dh0ph1_iw32ow32kw3sw1dw0pw1,1.2
onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,forward_training,src:bf16::blocked:acdb::f0 wei:bf16:a:blocked:AcdB16b16a2b::f0 dst:bf16::blocked:acdb::f0,,,mb16_ic64oc64,0.3
onednn_verbose,v1,primitive,create:cache_miss,cpu,convolution,brg_conv_fwd:avx2,forward_training,src:f32::blocked:acdb::f0,,,x,0.1
onednn_verbose,primitive,info,template:operation,engine,primitive,implementation,prop_kind,memory_descriptors,attributes,auxiliary,problem_desc,exec_time
onednn_verbose,primitive,exec,cpu,gemm_api,,undef,src_f32::blocked:ab:f0 wei_f32::blocked:ab:f0 dst_f32::blocked:ab:f0,,,120x256:256x64,21.5142
"""  # noqa: E501 - verbatim log lines; the last two from oneDNN 3.5 (TF 2.19), without "v1"


def test_kinds_and_dtypes_of_executed_primitives() -> None:
    assert executed_primitives(LOG) == {"gemm_api:f32": 3, "convolution:f32": 1,
                                        "convolution:bf16": 1}


def test_implementations_are_named_and_the_gemm_api_has_none() -> None:
    assert executed_primitives(LOG, implementation=True) == {
        "gemm_api - f32": 3,
        "convolution brg_conv_fwd:avx2 f32": 1,
        "convolution brg_conv_fwd:avx512_core_amx bf16": 1,
    }


def test_a_real_float32_matmul_is_read_as_float32() -> None:
    code = (
        "import tensorflow as tf\n"
        "a = tf.random.normal((256, 256))\n"
        "print('=== RUN', flush=True)\n"
        "tf.linalg.matmul(a, a).numpy()\n"
    )
    env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("=== RUN", 1)[1]
    counts = executed_primitives(out)
    # oneDNN on: a matmul primitive; off: Eigen's call into the gemm API. float32 either way.
    assert counts and all(key.endswith(":f32") for key in counts), counts
