"""GPU reference timing: PyTorch's fused ``_amp_foreach_non_finite_check_and_unscale_``.

Runs on a CUDA machine without TensorFlow (the project's lent GPU machines), on the same
gradient lists as ``tf_amp/cc/harness/unscale_harness.cu`` (ResNet-50 and BERT-base sizes,
float32, float16 and bfloat16, random finite data, median and range of interleaved repeats), so
the two outputs compare directly. Beside the fused call it times the unfused way, one multiply
and one finiteness reduction per tensor (what a framework without a fused op launches):

    nvcc -std=c++17 -O3 -I. -o harness tf_amp/cc/harness/unscale_harness.cu \
         -x cu tf_amp/cc/unscale_and_check_finite_gpu.cu.cc && ./harness
    python bench/gpu_torch_reference.py
"""

from __future__ import annotations

import argparse
import functools
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


def mean_ms(torch: Any, body: Any, iterations: int = 50) -> float:
    """Mean time of one call over `iterations` back-to-back calls, by device events."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        body()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iterations


def interleaved_ms(torch: Any, bodies: dict[str, Any], repeats: int = 7) -> dict[str, list[float]]:
    """Sorted per-repeat means of each body, the bodies taking turns (same clocks, neighbours)."""
    for body in bodies.values():
        body()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(repeats):
        for name, body in bodies.items():
            times[name].append(mean_ms(torch, body))
    return {name: sorted(values) for name, values in times.items()}


def unfused(torch: Any, grads: list[Any], found_inf: Any, inv_scale: Any) -> None:
    """One multiply and one all-finite reduction per tensor, combined at the end.

    The scale is taken 0-d: a 1-element float32 tensor would promote a float16 multiply to
    float32, which an in-place multiply refuses.
    """
    scalar = inv_scale.reshape(())
    finite = [torch.isfinite(g.mul_(scalar)).all() for g in grads]
    found_inf.copy_(~torch.stack(finite).all())


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    import torch  # after the arguments: --help works without PyTorch

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    torch.manual_seed(0)
    for model, sizes in (("resnet50", resnet50_sizes()), ("bert-base", bert_base_sizes())):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            # Scale 1: the data stays the same random finite values over every repeat.
            grads = [torch.randn(n, device="cuda").to(dtype) for n in sizes]
            found_inf = torch.zeros(1, device="cuda")
            inv_scale = torch.ones(1, device="cuda")
            nbytes = sum(g.numel() * g.element_size() for g in grads)
            bodies = {
                "fused": functools.partial(torch._amp_foreach_non_finite_check_and_unscale_,
                                           grads, found_inf, inv_scale),
                "unfused": functools.partial(unfused, torch, grads, found_inf, inv_scale),
            }
            for name in list(bodies):
                try:
                    bodies[name]()
                except (NotImplementedError, RuntimeError) as error:  # 2.11: fused, no bfloat16
                    print(f"torch {model} {dtype}: {name} unavailable ({error})")
                    del bodies[name]
                    continue
                if found_inf.item() != 0:  # each way on its own: the last call sets the flag
                    raise SystemExit(f"{model} {dtype}: {name}: finite data flagged non-finite")
            times = interleaved_ms(torch, bodies)
            line = (f"torch {model:9s} {str(dtype):14s} {len(sizes):4d} tensors"
                    f" {nbytes / 1e6:8.1f} MB:")
            for name, values in times.items():
                median = values[len(values) // 2]
                line += (f" {name} {median:.3f} ms [{values[0]:.3f}-{values[-1]:.3f}]"
                         f" ({2 * nbytes / median / 1e6:.0f} GB/s)")
            print(line)


if __name__ == "__main__":
    main()
