"""Reading ``ONEDNN_VERBOSE=1`` output: which oneDNN primitives ran, on which implementation,
in which data type. Shared by the benchmarks' proofs that reduced precision really ran."""

from __future__ import annotations

import re
from collections import Counter

# The source operand's data type: "src_f32::blocked..." (the gemm API that TensorFlow's Eigen
# kernels call) or "src:bf16::blocked..." (oneDNN primitives).
_SOURCE_DTYPE = re.compile(r"\bsrc(?:_|\w*:)(\w+?)::")
_VERSION = re.compile(r"v\d+")


def executed_primitives(log: str, implementation: bool = False) -> Counter[str]:
    """Counts of executed primitives in ``log``, keyed "kind:dtype" (e.g. "convolution:bf16"),
    or "kind implementation dtype" with ``implementation`` (e.g. "convolution
    brg_conv_fwd:avx2 f32"; the gemm API has no implementation name and shows "-")."""
    counts: Counter[str] = Counter()
    for line in log.splitlines():
        fields = line.split(",")
        if len(fields) > 1 and _VERSION.fullmatch(fields[1]):
            del fields[1]  # oneDNN 3.7 (TensorFlow 2.21) adds "v1"; 3.5 (TensorFlow 2.19) not
        # onednn_verbose, primitive, exec, cpu, kind, implementation, prop_kind, operands, ...
        if fields[0] != "onednn_verbose" or len(fields) <= 7 or fields[2] != "exec":
            continue
        found = _SOURCE_DTYPE.search(fields[7])
        dtype = found.group(1) if found else "?"
        kind = f"{fields[4]} {fields[5] or '-'}" if implementation else fields[4]
        counts[f"{kind} {dtype}" if implementation else f"{kind}:{dtype}"] += 1
    return counts
