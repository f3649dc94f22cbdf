"""Differential tests against TensorFlow 2.21's real GPU pass: the reference for the default.

The oracle is the CUDA build of TensorFlow in ``.venv-tf-gpu`` (``scripts/make_oracle_venv.sh``;
``.ci/run`` makes it), run as a subprocess by ``tests/_gpu_oracle.py``: Grappler with only
``auto_mixed_precision`` (the CUDA mode), every node on ``/device:GPU:0``, and a virtual
cluster whose GPU reports compute capability 8.0, CUDA 12.5 and cuDNN 9.3. No GPU is needed:
the pass asks the cluster, not the machine. The tests skip, saying why, only when that venv
is absent (and fail instead under ``TF_AMP_REQUIRE_GPU_ORACLE=1``, as CI sets it).

Our side runs with ``RewriteConfig(check_kernels=False)``: TensorFlow's GPU pass asks whether
a *GPU* kernel with half is registered, and this process's TensorFlow (``tensorflow-cpu``) has
no GPU kernels at all, so ``check_kernels=True`` with ``default_device_type="GPU"`` would
find none and convert nothing, while the default (CPU kernels) answers a different question.
Without the kernel check we trust the OpDef's allowed types, which is more permissive than the
GPU kernel table: an op whose OpDef allows half but that has no GPU half kernel would show up
as a vertex only we paint, which ``classify`` cannot excuse - so the comparison stays a check.

Every differing vertex needs a reason from ``REASONS`` in tests/_oracle.py (see
tests/test_differential_tf.py for the words), and Casts stay <= TensorFlow's per direction.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import _gpu_oracle, _model_graphs, _oracle
from tests.differential_helpers import (
    CPU_ORACLE_SKIPS_PASS_4,
    FAST_GRAPHS,
    SLOW_GRAPHS,
    check_default,
    cpu_oracle_runs_pass_4,
)
from tf_amp.config import RewriteConfig
from tf_amp.painter import CAT_CLEAR
from tf_amp.rewriter import rewrite_graph_def
from tf_amp.type_attrs import DT_HALF

pytestmark = pytest.mark.skipif(_gpu_oracle.should_skip(), reason=_gpu_oracle.missing_reason())

ALL = [*FAST_GRAPHS, *(pytest.param(name, marks=pytest.mark.slow) for name in SLOW_GRAPHS)]

_GPU: dict[str, tuple] = {}


def gpu_oracle(name: str) -> tuple:
    """(model, TensorFlow's GPU-pass rewrite), built once per module."""
    if name not in _GPU:
        model = _model_graphs.ALL_BUILDERS[name]()
        theirs, _ = _gpu_oracle.run_gpu_pass(model.graph_def, model.fetches)
        _GPU[name] = (model, theirs)
    return _GPU[name]


def ours(name: str, **changes: object) -> tuple:
    model, theirs = gpu_oracle(name)
    cfg = RewriteConfig(preserve_nodes=frozenset(model.fetches), check_kernels=False)
    result = rewrite_graph_def(model.graph_def, cfg.replace(**changes))
    return model, result, _oracle.compare(model.graph_def, result.graph_def, theirs)


def _dtype(graph_def: object, name: str, attr: str = "T") -> int:
    node = next(n for n in graph_def.node if n.name == name)  # type: ignore[attr-defined]
    return node.attr[attr].type


def test_the_gpu_pass_really_runs_and_runs_pass_4() -> None:
    model = _model_graphs.keras_cnn()
    out, log = _gpu_oracle.run_gpu_pass(model.graph_def, model.fetches, vmodule=True)
    assert "Beginning pass 4 to add infer list ops to allow if they directly follow allow" in log
    convs = [n.name for n in model.graph_def.node if n.op == "Conv2D"]
    matmuls = [n.name for n in model.graph_def.node if n.op == "MatMul"]
    assert convs and matmuls
    assert all(_dtype(out, n) == DT_HALF for n in convs + matmuls)
    # the BiasAdd right after the first Conv2D: no allow op after it before the deny-tainted
    # BatchNorm, so only pass 4 paints it
    first_bias = next(n for n in model.graph_def.node
                      if n.op == "BiasAdd" and n.input[0].split(":")[0] == convs[0])
    assert f"Painting type T of BiasAdd node {first_bias.name} ALLOW" in log
    assert _dtype(out, first_bias.name) == DT_HALF
    # control: the same call on a cluster without a GPU converts nothing
    control, _ = _gpu_oracle.run_gpu_pass(model.graph_def, model.fetches, with_gpu=False)
    assert all(_dtype(control, n) != DT_HALF for n in convs + matmuls)



def test_the_batch_matmuls_are_painted_as_the_gpu_pass_paints_them() -> None:
    """TensorFlow's CUDA allow list has BatchMatMul and BatchMatMulV2, not BatchMatMulV3
    (whose types Ta, Tb, Tout its pass leaves float32); ours had V3 too."""
    import tensorflow as tf

    w = tf.Variable(tf.ones((2, 8, 8)))

    @tf.function
    def both(x):
        v3 = tf.raw_ops.BatchMatMulV3(x=x, y=w, Tout=tf.float32, name="v3")
        return v3, tf.raw_ops.BatchMatMulV2(x=x, y=w, name="v2")

    concrete = both.get_concrete_function(tf.zeros((2, 4, 8)))
    graph_def = concrete.graph.as_graph_def()
    fetches = [t.op.name for t in concrete.outputs]
    theirs, _ = _gpu_oracle.run_gpu_pass(graph_def, fetches)
    cfg = RewriteConfig(target_dtype="float16", check_kernels=False,
                        preserve_nodes=frozenset(fetches))
    ours = rewrite_graph_def(graph_def, cfg).graph_def
    assert _dtype(theirs, "v2") == _dtype(ours, "v2") == DT_HALF
    for attr in ("Ta", "Tb", "Tout"):
        assert _dtype(ours, "v3", attr) == _dtype(theirs, "v3", attr) != DT_HALF


@pytest.mark.parametrize("name", ALL)
def test_default_matches_tensorflows_gpu_pass(name: str) -> None:
    model, result, comparison = ours(name)
    check_default(f"GPU pass {name}", model, result, comparison)


@pytest.mark.skipif(not cpu_oracle_runs_pass_4(), reason=CPU_ORACLE_SKIPS_PASS_4)
@pytest.mark.parametrize("name", ALL)
def test_cpu_mode_oracle_is_a_faithful_second_opinion(name: str) -> None:
    """TensorFlow's CPU mode (the in-process oracle) decides every vertex and Cast as its GPU
    pass does on these graphs, so tests/test_differential_tf.py checks the same thing."""
    model, theirs = gpu_oracle(name)
    cpu, _ = _oracle.run_tf_pass(model.graph_def, model.fetches)
    comparison = _oracle.compare(model.graph_def, cpu, theirs)
    assert comparison.vertices > 50
    assert comparison.differing == 0, (comparison.only_ours_half + comparison.only_tf_half)[:10]
    assert comparison.ours_casts == comparison.tf_casts


@pytest.mark.parametrize("name", ALL)
def test_without_const_folding_we_reproduce_the_gpu_pass(name: str) -> None:
    """Const folding, the normalization and accumulator guards and the table selection are the
    default's departures: without them, every vertex and every Cast is TensorFlow's - except
    at TensorLists crossing into a While (lstm_gru)."""
    model, result, comparison = ours(name, fold_constant_casts=False, guard_normalization=False,
                                     select_before_cast=False, guard_accumulators=False)
    print(f"\nparity {name}: {comparison.differing} differ; casts ours {comparison.ours_casts} "
          f"vs TF {comparison.tf_casts}")
    assert comparison.only_ours_half == []
    bodies = {b.name: b for b in result.report.bodies}
    for key in comparison.only_tf_half:
        body = bodies[key[0]]
        v = _oracle._vertex_keys(body)[key]
        assert body.view.v_attr[v] == "element_dtype" or body.painting.cat[v] == CAT_CLEAR, key
        assert name == "lstm_gru", key
    if name != "lstm_gru":
        assert comparison.differing == 0
        assert comparison.ours_casts == comparison.tf_casts


def test_infer_follows_allow_off_departs_from_the_gpu_pass() -> None:
    """The option keeps TensorFlow's pass-4 vertices float32: the comparison sees them."""
    model, result, comparison = ours("keras_cnn", infer_follows_allow=False)
    buckets = _oracle.classify(result, comparison)
    assert buckets[_oracle.TF_HALF_FEEDS_NO_ALLOW]
    assert buckets[_oracle.UNEXPLAINED] == []


@pytest.fixture(autouse=True, scope="module")
def _clear_cache() -> Iterator[None]:
    yield
    _GPU.clear()
