"""The ``auto`` target: chosen from the device and the CPU's features, said in words, and what
it changes (lists, loss scaling, whether anything is rewritten).

The CPU feature query is faked (``hardware.cpu_flags`` / ``hardware.onednn_enabled``), so these
tests mean the same on every machine. The rest of the suite pins float16 (conftest); these
tests unset that pin.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_amp
from tf_amp import hardware
from tf_amp.config import RewriteConfig
from tf_amp.enable import optimizer_wants_rewrite
from tf_amp.lists import BF16_INFER, FP16_DENY
from tf_amp.rewriter import rewrite_graph_def

XEON_AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
EPYC_ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
EPYC_ZEN3 = frozenset({"avx2", "fma", "f16c"})
# AVX-512 without its BF16 extension (Cascade Lake): oneDNN emulates bfloat16 there, slower.
XEON_CASCADE_LAKE = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni"})


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch):
    """Returns a setter faking this CPU's flags and oneDNN state; unpins the target."""
    monkeypatch.delenv("TF_AMP_TARGET_DTYPE", raising=False)

    def fake(flags: frozenset[str], onednn: bool = True) -> None:
        monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
        monkeypatch.setattr(hardware, "onednn_enabled", lambda: onednn)

    return fake


@pytest.mark.parametrize(
    ("device", "flags", "onednn", "dtype", "words"),
    [
        ("GPU", EPYC_ZEN3, True, "float16", "CUDA GPU"),
        ("CPU", XEON_AMX, True, "bfloat16", "AMX-BF16 and AVX512-BF16"),
        ("CPU", EPYC_ZEN4, True, "bfloat16", "AVX512-BF16"),
        ("CPU", EPYC_ZEN3, True, "float32", "neither AMX-BF16 nor AVX512-BF16"),
        ("CPU", XEON_CASCADE_LAKE, True, "float32", "neither AMX-BF16 nor AVX512-BF16"),
        ("CPU", XEON_AMX, False, "float32", "TF_ENABLE_ONEDNN_OPTS=0"),
    ],
)
def test_target_chosen_from_device_and_cpu_features(
    device: str, flags: frozenset[str], onednn: bool, dtype: str, words: str
) -> None:
    choice = hardware.choose_target(device, flags=flags, onednn=onednn)
    assert choice.dtype == dtype
    assert words in choice.reason
    assert choice.needs_loss_scaling == (dtype == "float16")
    assert choice.rewrites == (dtype != "float32")


@pytest.mark.parametrize(
    ("device", "flags", "forced", "words"),
    [
        ("CPU", EPYC_ZEN3, "bfloat16", "expect it to be slower than float32"),
        ("CPU", EPYC_ZEN3, "float16", "expect it to be slower than float32"),
        ("CPU", EPYC_ZEN4, "float16", "auto would pick bfloat16"),
        ("GPU", EPYC_ZEN3, "bfloat16", "auto would pick float16"),
    ],
)
def test_a_forced_target_says_when_auto_would_choose_otherwise(
    cpu, device: str, flags: frozenset[str], forced: str, words: str
) -> None:
    cpu(flags)
    config = RewriteConfig.from_env({"TF_AMP_TARGET_DTYPE": forced}, default_device_type=device)
    assert config.target_dtype == forced
    assert "asked for" in config.target_reason and words in config.target_reason
    # where auto agrees, nothing more is said
    same = hardware.choose_target(device).dtype
    if same != "float32":
        agreed = RewriteConfig(target_dtype=same, default_device_type=device)
        assert agreed.target_reason.endswith("(TF_AMP_TARGET_DTYPE or target_dtype)")


def test_from_env_defaults_to_auto_and_names_the_reason(cpu) -> None:
    cpu(EPYC_ZEN4)
    config = RewriteConfig.from_env({}, default_device_type="CPU")
    assert config.target_dtype == "bfloat16"
    assert "AVX512-BF16" in config.target_reason
    # the bfloat16 lists: BatchNorm's small ops may follow a bfloat16 input
    lists = config.resolved_lists()
    assert {"Mean", "Sum", "Rsqrt", "SquaredDifference"} <= lists.infer == BF16_INFER
    # a forced target wins, and says it was asked for
    forced = RewriteConfig.from_env({"TF_AMP_TARGET_DTYPE": "float16"}, default_device_type="CPU")
    assert forced.target_dtype == "float16" and "asked for" in forced.target_reason
    assert {"Mean", "Sum"} <= forced.resolved_lists().deny <= FP16_DENY
    # a GPU process gets float16 whatever the CPU
    assert RewriteConfig.from_env({}, default_device_type="GPU").target_dtype == "float16"
    # replace() with a new target gives a new reason, not the old one
    assert "asked for" in config.replace(target_dtype="float16").target_reason


def _matmul_graph() -> tf.compat.v1.GraphDef:
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        tf.identity(tf.matmul(x, x), name="y")
    return graph.as_graph_def()


def test_float32_target_leaves_the_graph_unchanged_and_says_why(cpu) -> None:
    cpu(EPYC_ZEN3)
    graph_def = _matmul_graph()
    config = RewriteConfig(target_dtype="auto", default_device_type="CPU")
    assert config.target_dtype == "float32" and not config.rewrites
    result = rewrite_graph_def(graph_def, config)
    assert result.graph_def == graph_def
    assert not result.report.changed
    assert "neither AMX-BF16 nor AVX512-BF16" in result.report.target_reason
    cpu(EPYC_ZEN4)
    auto = RewriteConfig(target_dtype="auto", default_device_type="CPU")
    bf16 = rewrite_graph_def(graph_def, auto)
    matmul = next(n for n in bf16.graph_def.node if n.op == "MatMul")
    assert matmul.attr["T"].type == tf.bfloat16.as_datatype_enum


@pytest.mark.parametrize(
    ("flags", "scaling"), [(EPYC_ZEN4, False), (XEON_AMX, False)]
)
def test_enable_adds_no_loss_scaling_for_bfloat16(cpu, flags, scaling) -> None:
    cpu(flags)
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    assert isinstance(opt, keras.optimizers.Optimizer)
    assert opt.enabled is scaling  # a pass-through wrapper: scale 1, no check, no skip
    # asked for explicitly, scaling is on whatever the target
    explicit = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1), "dynamic")
    assert explicit.enabled is True


def test_enable_on_a_cpu_without_fast_16_bit_changes_nothing(cpu) -> None:
    cpu(EPYC_ZEN3)
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    assert opt.enabled is False
    assert not optimizer_wants_rewrite(opt)  # fit keeps Keras's own step: no rebuild cost


@pytest.mark.parametrize("flags", [EPYC_ZEN4, EPYC_ZEN3], ids=["bfloat16", "float32"])
def test_enable_scales_under_a_keras_float16_policy_whatever_the_target(cpu, flags) -> None:
    # The wrapper is a loss-scale optimizer, so compile under mixed_float16 adds none of its
    # own: left pass-through, the model's float16 gradients underflowed and it stopped
    # training.
    cpu(flags)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert opt.enabled is True and float(opt.loss_scale) == 2.0**15


def test_enable_keeps_loss_scaling_for_float16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_AMP_TARGET_DTYPE", "float16")
    opt = tf_amp.enable_mixed_precision_graph_rewrite(keras.optimizers.SGD(0.1))
    assert opt.enabled is True


def test_function_runs_the_traced_graph_when_the_target_is_float32(cpu) -> None:
    cpu(EPYC_ZEN3)
    w = tf.Variable(np.eye(4, dtype=np.float32))

    @tf_amp.function
    def step(x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(x, w)

    x = tf.ones([4, 4])
    np.testing.assert_array_equal(step(x).numpy(), np.ones([4, 4]))
    # no rebuild: the concrete function run is the one tf.function traced
    assert step.get_concrete_function(x) is step.get_original_concrete_function(x)
    (report,) = step.reports
    assert report.target_dtype == "float32" and "AVX512-BF16" in report.target_reason


def test_infer_follows_allow_is_on_unless_the_environment_turns_it_off() -> None:
    # TensorFlow's pass 4 runs by default (its GPU and oneDNN passes both run it).
    assert RewriteConfig.from_env({}).infer_follows_allow is True
    off = RewriteConfig.from_env({"TF_AMP_INFER_FOLLOWS_ALLOW": "0"})
    assert off.infer_follows_allow is False
    with pytest.raises(ValueError, match="TF_AMP_INFER_FOLLOWS_ALLOW"):
        RewriteConfig.from_env({"TF_AMP_INFER_FOLLOWS_ALLOW": "sometimes"})
