"""The probe (``tf_amp.probe``): ops timed at their own shapes, the slow ones kept float32.

The decisions are tested with a timer that declares an op slow (deterministic); one test
times for real, to check what is timed and that the figures are measurements.
"""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

from tf_amp import probe
from tf_amp.cli import main as cli_main
from tf_amp.config import RewriteConfig
from tf_amp.lists import OpLists
from tf_amp.rewriter import rewrite_graph_def

BF16 = tf.bfloat16.as_datatype_enum


def step_graph() -> tf.compat.v1.GraphDef:
    #   x[8,16,16,4] -> Conv2D -> Reshape -> MatMul(a) -> Relu -> MatMul(b) -> Sum
    #                                          w1 [1024,64]          w2 [64,64]
    # MatMul a and b have different shapes: two signatures. MatMul c repeats b's shapes.
    @tf.function
    def f(x, k, w1, w2):
        h = tf.reshape(tf.nn.conv2d(x, k, 1, "SAME", name="conv"), [8, 1024])
        h = tf.nn.relu(tf.matmul(h, w1, name="matmul_a"))
        h = tf.matmul(h, w2, name="matmul_b") + tf.matmul(h, w2, name="matmul_c")
        return tf.reduce_sum(h)

    specs = [tf.TensorSpec(s) for s in ([8, 16, 16, 4], [3, 3, 4, 4], [1024, 64], [64, 64])]
    return f.get_concrete_function(*specs).graph.as_graph_def()


def categories(graph_def, target="bfloat16") -> dict[str, str]:
    lists = OpLists.default(target)
    return {n.op: lists.category(n.op) for n in graph_def.node if lists.category(n.op)}


def declared(slow_op: str, factor: float):
    """A timer: every op takes 1 ms in float32; ``slow_op`` takes ``factor`` ms reduced, the
    others half a millisecond."""

    def timer(signature: probe.Signature, dtype: str) -> float:
        if dtype == "float32":
            return 1e-3
        return factor * 1e-3 if signature.op == slow_op else 0.5e-3

    return timer


def test_an_allow_op_declared_slow_stays_float32_with_the_reason() -> None:
    graph_def = step_graph()
    timings = probe.probe_graph(graph_def, "bfloat16", categories(graph_def),
                                timer=declared("Conv2D", 3.0))
    by_op = {t.signature.op: t for t in timings if t.category == "allow"}
    assert by_op["Conv2D"].keep_float32 and by_op["Conv2D"].ratio == pytest.approx(3.0)
    assert not by_op["MatMul"].keep_float32
    slow = probe.slow_nodes(timings)
    assert any("conv" in name for name in slow) and not any("matmul" in n for n in slow)
    result = rewrite_graph_def(graph_def, RewriteConfig(target_dtype="bfloat16", slow_nodes=slow))
    nodes = {n.name: n for n in result.graph_def.node}
    (conv,) = (n for n in nodes.values() if n.op == "Conv2D")
    assert conv.attr["T"].type == tf.float32.as_datatype_enum
    assert all(n.attr["T"].type == BF16 for n in nodes.values() if n.op == "MatMul")
    decision = result.report.decision_for(conv.name)
    assert "measured slower" in decision.reason and decision.dtype == "float32"


@pytest.mark.parametrize(("factor", "kept"), [(1.4, False), (1.6, True)])
def test_an_infer_op_stays_float32_only_when_much_slower(factor: float, kept: bool) -> None:
    graph_def = step_graph()
    timings = probe.probe_graph(graph_def, "bfloat16", categories(graph_def),
                                timer=declared("AddV2", factor))
    (add,) = (t for t in timings if t.signature.op == "AddV2")
    assert add.category == "infer" and add.keep_float32 is kept


def test_real_timings_one_per_signature(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    graph_def = step_graph()
    timings = probe.probe_graph(graph_def, "bfloat16", categories(graph_def), repeats=2)
    matmuls = sorted((t for t in timings if t.signature.op == "MatMul"), key=lambda t: t.nodes)
    assert [len(t.nodes) for t in matmuls] == [1, 2]  # b and c share a signature
    assert {t.signature.op for t in timings} >= {"Conv2D", "MatMul", "AddV2"}
    assert all(t.float32_s > 0 and t.reduced_s > 0 for t in timings)
    path = tmp_path / "step.pb"
    path.write_bytes(graph_def.SerializeToString())
    assert cli_main(["probe", str(path), "--target-dtype", "bfloat16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "target: bfloat16" in out and "MatMul[[8, 1024], [1024, 64]]" in out
    assert "op signatures timed" in out


def test_unregistered_ops_and_ops_that_cannot_run_are_left_out_and_listed() -> None:
    """A custom op whose library is not loaded (here inside a library function the graph
    calls) cannot be imported: it and its readers are listed as untimed, the rest is timed.
    An op the target's OpDef does not allow (Cholesky has no bfloat16) is listed too."""
    from google.protobuf import text_format

    graph_def = tf.compat.v1.GraphDef()
    text_format.Parse(
        """
        node { name: "x" op: "Placeholder" attr { key: "dtype" value { type: DT_FLOAT } }
               attr { key: "shape" value { shape { dim { size: 4 } dim { size: 4 } } } } }
        node { name: "m" op: "MatMul" input: "x" input: "x"
               attr { key: "T" value { type: DT_FLOAT } } }
        node { name: "chol" op: "Cholesky" input: "m" attr { key: "T" value { type: DT_FLOAT } } }
        node { name: "call" op: "uses_custom" input: "m" input: "^chol" }
        node { name: "after" op: "MatMul" input: "call" input: "x"
               attr { key: "T" value { type: DT_FLOAT } } }
        library { function {
          signature { name: "uses_custom" input_arg { name: "a" type: DT_FLOAT }
                      output_arg { name: "o" type: DT_FLOAT } }
          node_def { name: "c" op: "MyCustomOp" input: "a" }
          ret { key: "o" value: "c:y:0" } } }
        """,
        graph_def,
    )
    found = {"MatMul": "allow", "Cholesky": "allow"}
    timings = probe.probe_graph(graph_def, "bfloat16", found, repeats=1)
    assert [t.nodes for t in timings] == [("m",)]
    untimed = {u.nodes: u.why for u in timings.untimed}
    assert untimed[("call",)].endswith("has not registered: MyCustomOp")
    assert "unregistered" in untimed[("after",)]
    assert "Cholesky[[4, 4]] has no bfloat16 kernel" in untimed[("chol",)]


def test_an_op_is_timed_as_the_rewrite_leaves_it() -> None:
    """FusedBatchNormV3: the rewrite turns T (x, y) and keeps U (the statistics) float32, for
    which its kernels ask. The probe set U to the target too, so the op could never run, and
    the reason it gave was "Graph execution error:", the first line of TensorFlow's message."""

    @tf.function
    def norm(x, scale, offset):
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, is_training=True)
        return y

    specs = [tf.TensorSpec(s) for s in ([2, 8, 8, 4], [4], [4])]
    graph_def = norm.get_concrete_function(*specs).graph.as_graph_def()
    for target in ("bfloat16", "float16"):
        timings = probe.probe_graph(graph_def, target, {"FusedBatchNormV3": "infer"}, repeats=1)
        assert [t.signature.op for t in timings] == ["FusedBatchNormV3"], timings.untimed


def test_a_run_error_is_said_by_its_telling_line() -> None:
    message = ("Graph execution error:\n\nDetected at node 'probe_bfloat16' defined at (most "
               "recent call last):\n    File \"x.py\", line 1, in <module>\nNode: "
               "'probe_bfloat16'\nNo OpKernel was registered to support Op 'Foo'\n"
               "Registered devices: [CPU]\n\n\t [[probe_bfloat16]]")
    assert probe._first_line(message) == "No OpKernel was registered to support Op 'Foo'"


def test_what_the_probe_cannot_time_is_listed_with_the_reason(caplog) -> None:  # noqa: ANN001
    """Ops of unknown batch size, and the ops inside functions (all of a TF2 SavedModel's),
    were left out in silence: "0 op signatures timed" and no word of why, and a rewrite with
    the probe on painted them as if it were off."""
    import logging

    weights = tf.ones((256, 256))

    def two_matmuls(x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(tf.matmul(x, weights), weights)

    unknown_batch = tf.function(two_matmuls).get_concrete_function(
        tf.TensorSpec([None, 256])).graph.as_graph_def()
    timings = probe.probe_graph(unknown_batch, "bfloat16", {"MatMul": "allow"}, repeats=1)
    assert len(timings) == 0
    ((names, why),) = [(u.nodes, u.why) for u in timings.untimed]
    assert len(names) == 2 and "not fully known" in why

    @tf.function
    def calls(x: tf.Tensor) -> tf.Tensor:
        return tf.function(two_matmuls)(x)

    with_a_call = calls.get_concrete_function(tf.TensorSpec([4, 256])).graph.as_graph_def()
    config = RewriteConfig(target_dtype="bfloat16", probe=True)
    with caplog.at_level(logging.INFO, "tf_amp"):
        rewrite_graph_def(with_a_call, config)
    assert "probe timed nothing" in caplog.text
    assert "a function call: the probe times the main graph's own ops" in caplog.text


def test_a_stateful_op_is_not_run_alone() -> None:
    """A Python function on a list (here as an infer op) was run about 300 times by the probe,
    with float16 data, though the rewrite never converts it: its side effects repeated."""
    calls = []

    def side_effect(x):
        calls.append(x.dtype)
        return x

    @tf.function
    def f(x, w):
        return tf.matmul(tf.numpy_function(side_effect, [x], tf.float32, stateful=True), w)

    specs = [tf.TensorSpec([8, 8]), tf.TensorSpec([8, 8])]
    graph_def = f.get_concrete_function(*specs).graph.as_graph_def()
    timings = probe.probe_graph(graph_def, "float16", {"PyFunc": "infer", "MatMul": "allow"},
                                repeats=1)
    assert not calls
    assert any("stateful" in u.why for u in timings.untimed), timings.untimed


def test_a_signature_is_timed_once_per_process() -> None:
    """A graph probed again (a tf_amp.Session's graph grows and is rewritten again) re-timed
    everything, seconds per run, and a noisy measurement could flip the decision."""
    graph_def = step_graph()
    first = probe.probe_graph(graph_def, "bfloat16", categories(graph_def), repeats=1)
    again = probe.probe_graph(graph_def, "bfloat16", categories(graph_def), repeats=1)
    assert [(t.signature, t.float32_s, t.reduced_s) for t in first] == [
        (t.signature, t.float32_s, t.reduced_s) for t in again
    ]


def test_a_probe_that_asks_for_more_repeats_measures_again(monkeypatch) -> None:
    """The once-per-process figures were keyed without the repeats: a 5-repeat figure answered
    a probe asking for 20, which then said nothing more precise. A figure answers requests
    for as many repeats as it was measured with, or fewer. (Starts from no figures: another
    test in the process may have measured these signatures with more repeats.)"""
    monkeypatch.setattr(probe, "_MEASURED", {})
    graph_def = step_graph()
    few = probe.probe_graph(graph_def, "bfloat16", categories(graph_def), repeats=1)
    more = probe.probe_graph(graph_def, "bfloat16", categories(graph_def), repeats=2)
    fewer_again = probe.probe_graph(graph_def, "bfloat16", categories(graph_def), repeats=1)
    assert [t.float32_s for t in more] != [t.float32_s for t in few]
    assert [t.float32_s for t in fewer_again] == [t.float32_s for t in more]


def test_an_allow_op_that_loses_only_noise_is_painted() -> None:
    timing = probe.OpTiming(probe.Signature("MatMul", ((8, 8),), b""), ("m",), 4e-6, 9e-6,
                            "allow")
    assert timing.ratio > 2 and not timing.keep_float32


def test_the_probe_under_the_environment_switch_times_float32_with_tensorflows_session():
    """Under TF_ENABLE_AUTO_MIXED_PRECISION the public Session is tf_amp's: the probe's own
    timing graph was rewritten (its float32 time was a float16 one) and probed again, until
    RecursionError."""
    import subprocess
    import sys

    script = (
        "import tensorflow as tf, tf_amp\n"
        "w = tf.Variable(tf.ones([64, 64]))\n"
        "@tf.function\n"
        "def step(x):\n"
        "    return tf.reduce_sum(tf.matmul(x, w))\n"
        "print('result', float(step(tf.ones([16, 64]))))\n"
    )
    env = dict(os.environ, TF_ENABLE_AUTO_MIXED_PRECISION="1", TF_AMP_TARGET_DTYPE="float16",
               TF_AMP_PROBE="1", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "result 65536.0" in done.stdout
    assert "RecursionError" not in done.stderr
