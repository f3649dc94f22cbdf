"""GPU reference timing: PyTorch's fused ``_amp_foreach_non_finite_check_and_unscale_``.

Runs on a CUDA machine without TensorFlow (the project's lent GPU machines), on the same
gradient lists as ``tf_amp/cc/harness/unscale_harness.cu`` (ResNet-50 and BERT-base sizes,
float32 and float16), so the two outputs compare directly:

    nvcc -std=c++17 -O3 -I. -o harness tf_amp/cc/harness/unscale_harness.cu \
         -x cu tf_amp/cc/unscale_and_check_finite_gpu.cu.cc && ./harness
    python bench/gpu_torch_reference.py
"""

from __future__ import annotations

import argparse
import os
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def resnet50_sizes() -> list[int]:
    with open(os.path.join(HERE, "shapes", "resnet50.txt")) as handle:
        return [int(line) for line in handle if line.strip() and not line.startswith("#")]


def bert_base_sizes(hidden: int = 768, ffn: int = 3072) -> list[int]:
    sizes = [30522 * hidden, 512 * hidden, 2 * hidden, hidden, hidden]
    for _ in range(12):
        sizes += [hidden * hidden, hidden] * 4
        sizes += [hidden, hidden, hidden * ffn, ffn, ffn * hidden, hidden, hidden, hidden]
    return sizes + [hidden * hidden, hidden]


def time_ms(torch: Any, body: Any, iterations: int = 50) -> float:
    body()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        body()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iterations


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    import torch  # after the arguments: --help works without PyTorch

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for model, sizes in (("resnet50", resnet50_sizes()), ("bert-base", bert_base_sizes())):
        for dtype in (torch.float32, torch.float16):
            grads = [torch.zeros(n, dtype=dtype, device="cuda") for n in sizes]
            found_inf = torch.zeros(1, device="cuda")
            inv_scale = torch.ones(1, device="cuda")
            nbytes = sum(g.numel() * g.element_size() for g in grads)
            ms = time_ms(torch, lambda g=grads, f=found_inf, s=inv_scale:
                         torch._amp_foreach_non_finite_check_and_unscale_(g, f, s))
            print(f"torch {model:9s} {str(dtype):13s} {len(sizes):4d} tensors "
                  f"{nbytes / 1e6:8.1f} MB: {ms:.3f} ms ({2 * nbytes / ms / 1e6:.0f} GB/s)")


if __name__ == "__main__":
    main()
