"""Which reduced precision is fast on the hardware at hand: the ``auto`` target.

Mixed precision exists to make training faster, and which 16-bit type does that depends on the
machine, not on the model:

* **CUDA GPU**: float16 (Tensor Cores; the NVIDIA recipe, loss scaling on).
* **CPU with AMX-BF16 or AVX512-BF16** (Intel Sapphire Rapids and later, AMD Zen 4 and later)
  and TensorFlow's oneDNN kernels on: bfloat16. oneDNN runs bfloat16 MatMul / Conv on those
  units; measured on TensorFlow 2.21: an AMD EPYC with AVX512-BF16 runs a 1024x1024 MatMul 2.7x
  and a 3x3 convolution 2x faster than float32, and a Xeon with AMX 6x. Without oneDNN
  (``TF_ENABLE_ONEDNN_OPTS=0``) bfloat16 falls back to Eigen, whose Conv2DBackpropFilter was 12x
  *slower* than float32 on the same EPYC.
* **Any other CPU**: none. float16 CPU kernels are emulated (oneDNN's reference kernels or
  Eigen): a float16 Conv2DBackpropFilter ran 7.6x (EPYC) to 130x (Xeon) slower than float32.
  Without AVX-512, TensorFlow leaves oneDNN off by default and its Eigen kernels convert 16-bit
  tensors to float32 and run float32's GEMM on them (``ONEDNN_VERBOSE=1`` shows ``gemm_api``
  with ``f32`` operands): measured on an AVX2 EPYC (``bench/op_speed.py``), bfloat16 MatMul
  took 1.14-1.25x float32's time and Conv2DBackpropInput / Filter 15-17x / 8-9x (float16:
  1.1-1.2x, 8-9x / 5.6-5.7x), and forcing oneDNN on changes nothing (it "supports DT_BFLOAT16
  only on platforms with AVX-512" and falls back to Eigen). AVX-512 alone is not enough: on a
  Cascade Lake Xeon (AVX-512 with VNNI, no BF16), oneDNN is on and emulates bfloat16
  (``gemm:jit:bf16`` matmuls, ``jit_bf16:avx512_core`` convolutions), 2.3-4.3x slower than
  float32 (geometric mean 3.2x), and float16 falls back to Eigen (1.2-25x slower). A user who
  asked for speed gets float32: the rewrite leaves the graph alone and says why once.

``TF_AMP_TARGET_DTYPE`` / ``RewriteConfig(target_dtype=...)`` still force a target.

The CPU features come from ``/proc/cpuinfo`` (Linux; elsewhere none are known and the CPU
counts as having neither); tests pass their own feature set to :func:`choose_target`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

# /proc/cpuinfo flag names (Linux kernel spelling).
AMX_BF16 = "amx_bf16"
AVX512_BF16 = "avx512_bf16"
FAST_BF16_FLAGS: tuple[str, ...] = (AMX_BF16, AVX512_BF16)

# Targets ``auto`` can resolve to. "float32" means: no reduced precision is fast here.
FLOAT16, BFLOAT16, FLOAT32 = "float16", "bfloat16", "float32"


@dataclass(frozen=True)
class TargetChoice:
    """The reduced-precision type chosen for a device, and the reason in plain words."""

    dtype: str
    reason: str

    @property
    def needs_loss_scaling(self) -> bool:
        """float16 underflows small gradients; bfloat16 has float32's exponent range."""
        return self.dtype == FLOAT16

    @property
    def rewrites(self) -> bool:
        """False when the choice is to keep float32 (nothing to rewrite)."""
        return self.dtype != FLOAT32


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def onednn_enabled() -> bool:
    """Whether TensorFlow's oneDNN CPU kernels are on: by default on x86 Linux builds on CPUs
    with AVX-512 (TensorFlow 2.21 left them off on an AVX2 EPYC), or as TF_ENABLE_ONEDNN_OPTS
    says."""
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() in ("0", "false", "off"):
        return False
    from tf_amp._upstream.tensorflow import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def choose_target(
    device_type: str,
    flags: frozenset[str] | None = None,
    onednn: bool | None = None,
) -> TargetChoice:
    """The ``auto`` target for graphs that run on ``device_type`` ("GPU" or "CPU").

    ``flags`` (this CPU's ``/proc/cpuinfo`` flags) and ``onednn`` (whether oneDNN kernels are
    on) default to this machine's; tests pass their own.
    """
    if device_type.upper() == "GPU":
        return TargetChoice(FLOAT16, "the graph runs on a CUDA GPU: float16 uses its Tensor Cores")
    flags = cpu_flags() if flags is None else flags
    found = [f for f in FAST_BF16_FLAGS if f in flags]
    if not found:
        return TargetChoice(
            FLOAT32,
            "this CPU has neither AMX-BF16 nor AVX512-BF16, so bfloat16 and float16 kernels "
            "are slower than float32 here; tf_amp keeps float32 unless TF_AMP_TARGET_DTYPE="
            "bfloat16 or float16 forces a target",
        )
    names = " and ".join(f.upper().replace("_", "-") for f in found)
    onednn = onednn_enabled() if onednn is None else onednn
    if not onednn:
        return TargetChoice(
            FLOAT32,
            f"this CPU has {names}, but TensorFlow's oneDNN kernels are off "
            "(TF_ENABLE_ONEDNN_OPTS=0) and its other bfloat16 kernels are slower than "
            "float32; tf_amp keeps float32, and unsetting TF_ENABLE_ONEDNN_OPTS gives bfloat16",
        )
    return TargetChoice(
        BFLOAT16, f"this CPU has {names}: oneDNN runs bfloat16 MatMul and convolutions on it"
    )


def forced_target(
    dtype: str,
    auto: TargetChoice | None = None,
    asked_by: str = "TF_AMP_TARGET_DTYPE or target_dtype",
) -> TargetChoice:
    """A target the user named (``TF_AMP_TARGET_DTYPE`` or ``RewriteConfig``).

    ``auto`` is what ``auto`` would pick for the same device: where it differs, the reason says
    so, and where ``auto`` would keep float32 it says to expect the forced target to be slower
    (a forced bfloat16 ran an AVX2 EPYC's convolution gradients 8-17x slower than float32), so
    nobody takes a slower run for what mixed precision does. ``asked_by`` names the setting in
    the reason; a caller that knows which one the user set (``tf-amp --target-dtype``) says so.
    """
    reason = f"{dtype} was asked for ({asked_by})"
    if auto is None or auto.dtype == dtype:
        return TargetChoice(dtype, reason)
    if auto.dtype == FLOAT32:
        return TargetChoice(
            dtype,
            f"{reason}; expect it to be slower than float32 on this machine, where auto keeps "
            "float32 (its 16-bit kernels are slower; TF_AMP_PROBE=1 keeps the ops it measures "
            "slower in float32)",
        )
    return TargetChoice(dtype, f"{reason}; auto would pick {auto.dtype} on this device")
