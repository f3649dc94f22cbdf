"""Reading ``ONEDNN_VERBOSE=1`` output: which oneDNN primitives ran, on which implementation,
in which data type. Shared by the benchmarks' proofs that reduced precision really ran."""

from __future__ import annotations

import re
from collections import Counter

# The source operand's data type: "src_f32::blocked..." (the gemm API that TensorFlow's Eigen
# kernels call) or "src:bf16::blocked..." (oneDNN primitives).
_SOURCE_DTYPE = re.compile(r"\bsrc(?:_|\w*:)(\w+?)::")


def executed_primitives(log: str, implementation: bool = False) -> Counter[str]:
    """Counts of executed primitives in ``log``, keyed "kind:dtype" (e.g. "convolution:bf16"),
    or "kind implementation dtype" with ``implementation`` (e.g. "convolution
    brg_conv_fwd:avx2 f32"; the gemm API has no implementation name and shows "-")."""
    counts: Counter[str] = Counter()
    for line in log.splitlines():
        fields = line.split(",")
        if not line.startswith("onednn_verbose") or len(fields) <= 8 or fields[3] != "exec":
            continue
        found = _SOURCE_DTYPE.search(fields[8])
        dtype = found.group(1) if found else "?"
        kind = f"{fields[5]} {fields[6] or '-'}" if implementation else fields[5]
        counts[f"{kind} {dtype}" if implementation else f"{kind}:{dtype}"] += 1
    return counts
