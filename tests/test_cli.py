"""``tf-amp`` command line: rewrite (GraphDef, SavedModel), inspect, lists."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.e2e_helpers import half_ops
from tf_amp import cli


def _matmul_graph_def() -> tf.compat.v1.GraphDef:
    """x -> MatMul(w) -> Relu -> Sum: MatMul and Relu convert, Sum (deny) stays float32."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(np.ones((8, 8), np.float32), name="w")
        tf.reduce_sum(tf.nn.relu(tf.matmul(x, w, name="mm")), name="out")
    return graph.as_graph_def()


@pytest.mark.parametrize("suffix", [".pb", ".pbtxt"])
def test_rewrite_graph_def_file(
    tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = tmp_path / f"in{suffix}", tmp_path / f"out{suffix}"
    cli.write_graph_def(_matmul_graph_def(), str(source))
    assert cli.main(["rewrite", str(source), str(target), "--preserve", "out"]) == 0
    assert "Converted" in capsys.readouterr().out
    rewritten = cli.read_graph_def(str(target))
    assert "MatMul" in half_ops(rewritten)
    nodes = {n.name: n for n in rewritten.node}
    assert nodes["out"].attr["T"].type == tf.float32.as_datatype_enum


def test_rewrite_saved_model_loads_and_runs_in_half(tmp_path: Path) -> None:
    class Net(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(tf.random.stateless_normal((16, 16), seed=(1, 1)))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
        def __call__(self, x: tf.Tensor) -> tf.Tensor:
            return tf.nn.relu(tf.matmul(x, self.w))

    net = Net()
    source, target = tmp_path / "fp32_model", tmp_path / "amp_model"
    tf.saved_model.save(net, str(source))
    assert cli.main(["rewrite", str(source), str(target)]) == 0

    loaded = tf.saved_model.load(str(target))
    x = tf.random.stateless_normal((4, 16), seed=(2, 2))
    got = loaded.signatures["serving_default"](x=x)
    (output,) = got.values()
    assert output.dtype == tf.float32
    np.testing.assert_allclose(output.numpy(), net(x).numpy(), rtol=2e-2, atol=2e-2)
    library = loaded.signatures["serving_default"].graph.as_graph_def()
    assert "MatMul" in half_ops(library)
    assert (target / "variables").is_dir()


def _rewrite_with_logs(tmp_path: Path) -> Path:
    """Rewrites the MatMul graph with a log directory; returns the directory."""
    source, logs = tmp_path / "in.pb", tmp_path / "logs"
    cli.write_graph_def(_matmul_graph_def(), str(source))
    cli.main(["rewrite", str(source), str(tmp_path / "out.pb"), "--log-dir", str(logs)])
    return logs


def test_inspect_reports_conversions_casts_and_float32_islands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = _rewrite_with_logs(tmp_path)
    capsys.readouterr()
    assert cli.main(["inspect", str(logs)]) == 0
    text = capsys.readouterr().out
    assert "Converted" in text
    assert "MatMul" in text.split("by type:")[1]
    # x (and w, unless the rewriter folds the constant) in; Relu's output back out to Sum
    casts = re.search(r"casts: (\d+) to 16-bit, (\d+) back to float32", text)
    assert casts and int(casts.group(1)) >= 1 and int(casts.group(2)) == 1
    assert "float32 islands: 1" in text and "Sum" in text and "deny list" in text


def test_a_node_with_a_converted_attr_is_no_float32_island(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # FusedBatchNormV3's T turns half and its U (statistics) stays float32 by its OpDef: it
    # was listed both as converted and as an island "with no float16 kernel registered".
    from tf_amp.config import RewriteConfig
    from tf_amp.rewriter import rewrite_graph_def

    @tf.function
    def f(x, w, scale, offset):  # noqa: ANN001, ANN202
        y = tf.nn.conv2d(x, w, 1, "SAME")
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(y, scale, offset, is_training=True)
        return tf.reduce_sum(tf.nn.conv2d(tf.nn.relu(y), w, 1, "SAME"))

    graph_def = f.get_concrete_function(
        tf.TensorSpec([2, 8, 8, 4]), tf.TensorSpec([3, 3, 4, 4]), tf.TensorSpec([4]),
        tf.TensorSpec([4])).graph.as_graph_def()
    logs = tmp_path / "logs"
    report = rewrite_graph_def(graph_def, RewriteConfig(log_dir=str(logs))).report
    statistics = report.decision_for("FusedBatchNormV3", "U")
    assert statistics.dtype == "float32"
    assert statistics.reason == (
        "FusedBatchNormV3's OpDef does not allow float16 for U: kept float32")
    assert report.decision_for("FusedBatchNormV3", "T").dtype == "float16"
    capsys.readouterr()
    assert cli.main(["inspect", str(logs)]) == 0
    islands = capsys.readouterr().out.split("float32 islands:")[1]
    assert "FusedBatchNormV3" not in islands and "Sum" in islands


def test_inspect_names_each_logged_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Many functions share one log directory; the header showed only a stamp.
    from tf_amp.config import RewriteConfig
    from tf_amp.rewriter import rewrite_graph_def

    logs = tmp_path / "logs"
    for name in ("train_step", "eval_step"):
        rewrite_graph_def(_matmul_graph_def(), RewriteConfig(log_dir=str(logs)),
                          graph_name=name)
    capsys.readouterr()
    assert cli.main(["inspect", str(logs)]) == 0
    headers = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("== graph")]
    assert [h.rsplit(" ", 1)[-1] for h in headers] == ["(train_step)", "(eval_step)"]


def test_inspect_lists_rewrites_of_one_millisecond_in_their_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The order was by the stamp's last part, the millisecond, not its counter.
    from tf_amp import graph_log
    from tf_amp.config import RewriteConfig
    from tf_amp.rewriter import rewrite_graph_def

    logs = tmp_path / "logs"
    names = [f"step_{i}" for i in range(12)]
    monkeypatch.setattr(graph_log.time, "time", lambda: 1_000_000.0)
    for name in names:
        rewrite_graph_def(_matmul_graph_def(), RewriteConfig(log_dir=str(logs)),
                          graph_name=name)
    monkeypatch.undo()
    capsys.readouterr()
    assert cli.main(["inspect", str(logs)]) == 0
    headers = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("== graph")]
    assert [h.rsplit(" ", 1)[-1] for h in headers] == [f"({name})" for name in names]


def test_inspect_of_an_empty_directory_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["inspect", str(tmp_path)]) == 1
    assert "no rewrite logs" in capsys.readouterr().out


def test_lists_apply_environment_overrides(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_DENYLIST_REMOVE", "Sum")
    monkeypatch.setenv("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_INFERLIST_ADD", "Sum")
    assert cli.main(["lists", "--json"]) == 0
    lists = json.loads(capsys.readouterr().out)
    assert "Sum" in lists["infer"] and "Sum" not in lists["deny"]
    assert "MatMul" in lists["allow"]


def test_lists_under_a_float32_target_do_not_call_themselves_effective(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A float32 target rewrites nothing: ``tf-amp lists`` printed float16's lists as the
    "effective lists for float32", and its JSON named them float32's."""
    from tf_amp import hardware

    choose = hardware.choose_target  # "auto" as on a CPU without fast bfloat16
    monkeypatch.setattr(hardware, "choose_target", lambda *_: choose("CPU", frozenset()))
    monkeypatch.delenv("TF_AMP_TARGET_DTYPE")
    assert cli.main(["lists"]) == 0
    out = capsys.readouterr().out
    assert "effective" not in out
    assert "the float32 target rewrites nothing; the lists a float16 target would use" in out
    assert cli.main(["lists", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert (listed["rewrites"], listed["lists_for"]) == (False, "float16")
    monkeypatch.setenv("TF_AMP_TARGET_DTYPE", "bfloat16")
    assert cli.main(["lists"]) == 0
    assert "effective lists for bfloat16" in capsys.readouterr().out


def test_bad_input_gives_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "junk.pb").write_bytes(b"\xff\x00 not a graph")
    assert cli.main(["rewrite", str(tmp_path / "junk.pb"), str(tmp_path / "o.pb")]) == 2
    assert "neither a binary nor a text GraphDef" in capsys.readouterr().err
    assert cli.main(["rewrite", str(tmp_path), str(tmp_path / "o")]) == 2
    assert "without saved_model.pb" in capsys.readouterr().err


def _saved_model(path: Path) -> None:
    class Net(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(tf.ones((4, 4)))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def __call__(self, x: tf.Tensor) -> tf.Tensor:
            return tf.matmul(x, self.w)

    tf.saved_model.save(Net(), str(path))


def test_rewrite_never_deletes_what_is_not_an_earlier_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OUT is replaced only when it is an earlier output (or empty), never when it holds IN."""
    parent = tmp_path / "work"
    source = parent / "models" / "fp32"
    _saved_model(source)
    (parent / "notes.txt").write_text("important")
    assert cli.main(["rewrite", str(source), str(parent)]) == 2
    assert "contains IN" in capsys.readouterr().err
    assert (source / "saved_model.pb").exists() and (parent / "notes.txt").exists()
    assert cli.main(["rewrite", str(source), str(parent / "models")]) == 2
    capsys.readouterr()
    other = tmp_path / "someone_elses"
    other.mkdir()
    (other / "data.csv").write_text("1,2")
    assert cli.main(["rewrite", str(source), str(other)]) == 2
    assert "did not write" in capsys.readouterr().err
    assert (other / "data.csv").exists()
    # Was written, into the user's model (and copied along by its next rewrite).
    assert cli.main(["rewrite", str(source), str(source / "amp")]) == 2
    assert "is inside IN" in capsys.readouterr().err
    assert not (source / "amp").exists()
    users_model = tmp_path / "users_other_model"  # a SavedModel, but not one tf-amp wrote
    _saved_model(users_model)
    assert cli.main(["rewrite", str(source), str(users_model)]) == 2
    assert (users_model / "saved_model.pb").exists()
    capsys.readouterr()
    target = tmp_path / "amp"
    assert cli.main(["rewrite", str(source), str(target)]) == 0
    assert cli.main(["rewrite", str(source), str(target)]) == 0  # an earlier output: replaced
    assert tf.saved_model.load(str(target)).signatures["serving_default"] is not None
    graph = tmp_path / "g.pb"
    cli.write_graph_def(_matmul_graph_def(), str(graph))
    before = graph.read_bytes()
    assert cli.main(["rewrite", str(graph), str(graph)]) == 2
    assert "OUT must differ from IN" in capsys.readouterr().err
    assert graph.read_bytes() == before


def test_a_sparse_signature_output_of_a_tf1_saved_model_stays_float32(tmp_path: Path) -> None:
    """A SparseTensor output's TensorInfo names its three tensors in ``coo_sparse``; only
    ``name`` (empty for it) was kept, so its values came back float16."""
    source, target = tmp_path / "fp32", tmp_path / "amp"
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        w = tf.constant(np.linspace(-0.3, 0.3, 256, dtype=np.float32).reshape(16, 16))
        sparse = tf.sparse.from_dense(tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w)), w)))
        info = tf.compat.v1.saved_model.build_tensor_info
        signature = tf.compat.v1.saved_model.signature_def_utils.build_signature_def(
            {"x": info(x)}, {"sparse": info(sparse)}, "tensorflow/serving/predict"
        )
        with tf.compat.v1.Session(graph=graph) as sess:
            builder = tf.compat.v1.saved_model.Builder(str(source))
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={"serving_default": signature}
            )
            builder.save()
    assert cli.main(["rewrite", str(source), str(target), "--target-dtype", "float16"]) == 0
    x_value = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)
    served = {
        name: tf.saved_model.load(str(path)).signatures["serving_default"](x=x_value)["sparse"]
        for name, path in (("fp32", source), ("amp", target))
    }
    assert served["amp"].values.dtype == tf.float32
    np.testing.assert_allclose(served["amp"].values, served["fp32"].values, rtol=2e-2)


def test_a_tensor_only_a_collection_names_keeps_its_dtype(tmp_path: Path) -> None:
    """A TF1 loader may fetch what ``tf.compat.v1.get_collection`` gives (a model's
    ``predictions``); kept only for the signatures, such a tensor came back float16."""
    source, target = tmp_path / "fp32", tmp_path / "amp"
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        w = tf.constant(np.linspace(-0.3, 0.3, 256, dtype=np.float32).reshape(16, 16))
        hidden = tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(x, w)), w), name="hidden")
        out = tf.reduce_sum(tf.matmul(hidden, w), axis=1, name="out")
        tf.compat.v1.add_to_collection("predictions", hidden)
        info = tf.compat.v1.saved_model.build_tensor_info
        signature = tf.compat.v1.saved_model.signature_def_utils.build_signature_def(
            {"x": info(x)}, {"out": info(out)}, "tensorflow/serving/predict"
        )
        with tf.compat.v1.Session(graph=graph) as sess:
            builder = tf.compat.v1.saved_model.Builder(str(source))
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={"serving_default": signature}
            )
            builder.save()
    assert cli.main(["rewrite", str(source), str(target), "--target-dtype", "float16"]) == 0
    x_value = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)
    fetched = {}
    for name, path in (("fp32", source), ("amp", target)):
        with tf.Graph().as_default() as loaded, tf.compat.v1.Session(graph=loaded) as sess:
            tf.compat.v1.saved_model.load(sess, ["serve"], str(path))
            (predictions,) = tf.compat.v1.get_collection("predictions")
            assert predictions.dtype == tf.float32
            fetched[name] = sess.run(predictions, {"x:0": x_value})
            half = {n.op for n in loaded.as_graph_def().node if n.attr["T"].type == tf.half}
    assert "MatMul" in half  # the rest is still rewritten
    np.testing.assert_allclose(fetched["amp"], fetched["fp32"], rtol=2e-2, atol=1e-3)


def test_a_failed_rewrite_leaves_the_earlier_output_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """OUT was deleted before the copy: a copy that failed (a full disk) lost the earlier
    output. The new one is written beside it and moved in only when complete."""
    from tf_amp.cli import saved_model

    source, target = tmp_path / "fp32", tmp_path / "amp"
    _saved_model(source)
    assert cli.main(["rewrite", str(source), str(target), "--target-dtype", "float16"]) == 0
    before = (target / "saved_model.pb").read_bytes()

    copytree = saved_model.shutil.copytree

    def full_disk(*args: object, **kwargs: object) -> object:
        monkeypatch.undo()  # copytree calls itself for subdirectories: only the top one fails
        copytree(*args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(saved_model.shutil, "copytree", full_disk)
    assert cli.main(["rewrite", str(source), str(target), "--target-dtype", "float16"]) != 0
    assert "No space left" in capsys.readouterr().err
    assert (target / "saved_model.pb").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["amp", "fp32"]  # no partial copy
    assert tf.saved_model.load(str(target)).signatures["serving_default"] is not None


def test_rewritten_saved_model_gets_its_own_fingerprint(tmp_path: Path) -> None:
    from tensorflow.core.protobuf import fingerprint_pb2
    from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

    source, target = tmp_path / "fp32", tmp_path / "amp"
    _saved_model(source)
    assert cli.main(["rewrite", str(source), str(target)]) == 0
    stored, fresh, original = (fingerprint_pb2.FingerprintDef() for _ in range(3))
    stored.ParseFromString((target / "fingerprint.pb").read_bytes())
    fresh.ParseFromString(fingerprinting.CreateFingerprintDef(str(target)))
    original.ParseFromString((source / "fingerprint.pb").read_bytes())
    assert stored.saved_model_checksum == fresh.saved_model_checksum
    assert stored.saved_model_checksum != original.saved_model_checksum


def test_more_bad_input_gives_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.pbtxt").write_text("garbage {{")
    assert cli.main(["rewrite", str(tmp_path / "bad.pbtxt"), str(tmp_path / "o.pbtxt")]) == 2
    assert "not a text GraphDef" in capsys.readouterr().err
    good = tmp_path / "in.pb"
    cli.write_graph_def(_matmul_graph_def(), str(good))
    (tmp_path / "a_dir").mkdir()
    assert cli.main(["rewrite", str(good), str(tmp_path / "a_dir")]) == 2
    assert "is a directory" in capsys.readouterr().err
    (tmp_path / "a_file").write_text("x")
    assert cli.main(["rewrite", str(good), str(tmp_path / "o.pb"), "--log-dir",
                     str(tmp_path / "a_file")]) == 2
    assert "error" in capsys.readouterr().err


def test_paths_of_the_wrong_kind_are_refused_in_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty file was "rewritten" as a GraphDef of nothing (a 0-byte output); an OUT that is
    a symbolic link passed the checks and failed after the whole rewrite ("Cannot call rmtree
    on a symbolic link"); other path errors read "[Errno 17] File exists: ...". """
    empty = tmp_path / "empty.pb"
    empty.write_bytes(b"")
    assert cli.main(["rewrite", str(empty), str(tmp_path / "out.pb")]) == 2
    assert "is empty: not a GraphDef" in capsys.readouterr().err
    assert not (tmp_path / "out.pb").exists()

    source = tmp_path / "model"
    _saved_model(source)
    (tmp_path / "real_out").mkdir()
    (tmp_path / "link_out").symlink_to(tmp_path / "real_out")
    assert cli.main(["rewrite", str(source), str(tmp_path / "link_out")]) == 2
    assert "is a symbolic link" in capsys.readouterr().err

    good = tmp_path / "in.pb"
    cli.write_graph_def(_matmul_graph_def(), str(good))
    (tmp_path / "a_file").write_text("x")
    assert cli.main(["rewrite", str(good), str(tmp_path / "a_file" / "out.pb")]) == 2
    err = capsys.readouterr().err
    assert "a file is in the way of a directory" in err and "Errno" not in err
    assert cli.main(["probe", str(source)]) == 2
    err = capsys.readouterr().err
    assert "is a directory; a file is expected" in err and "Errno" not in err


def test_inspect_skips_files_that_only_share_a_log_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = _rewrite_with_logs(tmp_path)
    cli.write_graph_def(_matmul_graph_def(), str(logs / "graphdef_preop_frozen.pb"))
    (logs / "decisions_AutoMixedPrecision_copy.jsonl").write_text("")
    capsys.readouterr()
    assert cli.main(["inspect", str(logs)]) == 0
    assert "Converted" in capsys.readouterr().out


def test_graph_def_outputs_keep_float32_without_preserve(tmp_path: Path) -> None:
    """A frozen graph names no fetches: its outputs (nodes nothing reads) keep their dtype."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(np.ones((8, 8), np.float32), name="w")
        tf.identity(tf.nn.relu(tf.matmul(x, w, name="mm")), name="logits")
    source, target = tmp_path / "frozen.pb", tmp_path / "amp.pb"
    cli.write_graph_def(graph.as_graph_def(), str(source))
    assert cli.main(["rewrite", str(source), str(target)]) == 0
    rewritten = cli.read_graph_def(str(target))
    assert "MatMul" in half_ops(rewritten)
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(rewritten, name="")
        logits = tf.compat.v1.get_default_graph().get_tensor_by_name("logits:0")
        assert logits.dtype == tf.float32


def test_a_guessed_output_set_names_the_nodes_that_changed_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Logits read by a softmax are no output by the guess (nodes nothing reads): fetched, they
    came back float16 without a word. The nodes that changed type are named, with the flags
    that keep them; with ``--preserve`` nothing is guessed and nothing is said."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        w = tf.constant(np.ones((8, 8), np.float32), name="w")
        logits = tf.identity(tf.matmul(x, w, name="mm"), name="logits")
        tf.nn.softmax(logits, name="probs")
    source, target = tmp_path / "frozen.pb", tmp_path / "amp.pb"
    cli.write_graph_def(graph.as_graph_def(), str(source))
    assert cli.main(["rewrite", str(source), str(target), "--target-dtype", "float16"]) == 0
    said = capsys.readouterr().err
    assert "1 output(s) nothing reads (probs)" in said
    assert "changed type (logits, mm)" in said and "--preserve NAME" in said
    argv = ["rewrite", str(source), str(target), "--target-dtype", "float16",
            "--preserve", "logits,probs"]
    assert cli.main(argv) == 0
    assert "changed type" not in capsys.readouterr().err
    nodes = {n.name: n for n in cli.read_graph_def(str(target)).node}
    assert nodes["logits"].attr["T"].type == tf.float32.as_datatype_enum


def test_an_exclude_scope_that_matches_no_node_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped scope kept nothing float32, in silence; a mistyped --preserve is an error."""
    source, target = tmp_path / "in.pb", tmp_path / "out.pb"
    cli.write_graph_def(_matmul_graph_def(), str(source))
    argv = ["rewrite", str(source), str(target), "--target-dtype", "float16"]
    assert cli.main([*argv, "--exclude-scope", "m", "--exclude-scope", "mm"]) == 0
    said = capsys.readouterr().err
    assert "--exclude-scope m matches no node" in said
    assert "--exclude-scope mm matches" not in said
    assert "MatMul" not in half_ops(cli.read_graph_def(str(target)))  # "mm" was kept


def test_preserve_naming_a_node_the_graph_lacks_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--preserve replaces the default (the outputs): a typo would let "out" turn half in a
    file written as if all were well, so nothing is written and the name is given."""
    source, target = tmp_path / "in.pb", tmp_path / "out.pb"
    cli.write_graph_def(_matmul_graph_def(), str(source))
    argv = ["rewrite", str(source), str(target), "--target-dtype", "bfloat16"]
    assert cli.main([*argv, "--preserve", "out,NoSuchNode"]) == 2
    assert "--preserve names node(s)" in capsys.readouterr().err
    assert not target.exists()
    assert cli.main([*argv, "--preserve", "out"]) == 0


def test_preserve_naming_a_node_no_meta_graph_has_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = tmp_path / "model", tmp_path / "amp"
    _saved_model(source)
    argv = ["rewrite", str(source), str(target), "--target-dtype", "float16"]
    assert cli.main([*argv, "--preserve", "NoSuchNode"]) == 2
    assert "--preserve names node(s)" in capsys.readouterr().err and not target.exists()
    assert cli.main([*argv, "--preserve", "saver_filename"]) == 0  # a node of the MetaGraph


def _float32_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes ``auto`` resolve to float32, as on a CPU without fast 16-bit kernels."""
    from tf_amp import hardware

    monkeypatch.delenv("TF_AMP_TARGET_DTYPE", raising=False)
    monkeypatch.setattr(
        hardware, "choose_target", lambda *a, **k: hardware.TargetChoice("float32", "test")
    )


def test_probe_reads_its_input_before_looking_at_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing or malformed GraphDef is an error even where there is nothing to time."""
    _float32_target(monkeypatch)
    assert cli.main(["probe", str(tmp_path / "nope.pb")]) == 2
    assert "nope.pb" in capsys.readouterr().err
    (tmp_path / "bad.pbtxt").write_text("garbage {{")
    assert cli.main(["probe", str(tmp_path / "bad.pbtxt")]) == 2
    assert "not a text GraphDef" in capsys.readouterr().err
    good = tmp_path / "in.pb"
    cli.write_graph_def(_matmul_graph_def(), str(good))
    assert cli.main(["probe", str(good)]) == 0
    assert "nothing to time: the target is float32" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["probe", "in.pb", "--repeats", "0"], "--repeats"),
        (["probe", "in.pb", "--repeats", "two"], "--repeats"),
        (["inspect", "logs", "--islands", "-1"], "--islands"),
    ],
)
def test_counts_are_checked_by_the_parser(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "Traceback" not in err


@pytest.mark.parametrize("content", [bytes(range(7, 207)), b""], ids=["corrupt", "empty"])
def test_a_damaged_saved_model_is_named_in_the_error(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "badsm"
    source.mkdir()
    (source / "saved_model.pb").write_bytes(content)
    target = tmp_path / "out"
    assert cli.main(["rewrite", "--target-dtype", "float16", str(source), str(target)]) == 2
    err = capsys.readouterr().err
    assert str(source / "saved_model.pb") in err and "is not a" in err and "SavedModel" in err
    assert "Traceback" not in err and not target.exists()


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"node": "x", oops}', "not JSON"),
        ("[1, 2]", "a list, not a JSON object"),
        ('{"node": "x", "reason": "kept"}', "a decision without 'op'"),
        ('{"node": ["x"], "op": "Relu", "reason": "kept"}', "a decision whose 'node' is not text"),
    ],
)
def test_inspect_names_the_file_and_line_of_a_damaged_decision(
    tmp_path: Path, line: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = _rewrite_with_logs(tmp_path)
    (decisions,) = logs.glob("decisions_AutoMixedPrecision_*.jsonl")
    records = decisions.read_text().splitlines()
    records.insert(2, line)
    decisions.write_text("\n".join(records) + "\n")
    capsys.readouterr()
    assert cli.main(["inspect", str(logs)]) == 2
    err = capsys.readouterr().err
    assert f"{decisions}, line 3: {words}" in err and "Traceback" not in err


def _graph_with_an_unregistered_op() -> tf.compat.v1.GraphDef:
    """The MatMul graph, then ``u`` (an op type no TensorFlow registers) and ``mm2`` reading
    it: the probe can time ``mm`` but not ``u`` nor ``mm2``."""
    graph_def = _matmul_graph_def()
    (x,) = (n for n in graph_def.node if n.name == "x")
    x.attr["shape"].shape.CopyFrom(tf.TensorShape([4, 8]).as_proto())
    unknown = graph_def.node.add(name="u", op="TotallyUnknownOp", input=["mm"])
    unknown.attr["T"].type = tf.float32.as_datatype_enum
    reader = graph_def.node.add(name="mm2", op="MatMul", input=["u", "w"])
    reader.attr["T"].type = tf.float32.as_datatype_enum
    return graph_def


def test_probe_times_what_it_can_and_names_unregistered_ops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    source = tmp_path / "unk.pbtxt"
    cli.write_graph_def(_graph_with_an_unregistered_op(), str(source))
    argv = ["--target-dtype", "bfloat16"]
    assert cli.main(["probe", *argv, "--repeats", "1", str(source)]) == 0
    out = capsys.readouterr().out
    assert "MatMul[[4, 8], [8, 8]]" in out  # mm, upstream of the unknown op, is timed
    assert "not timed: 1 node(s) (u): uses op types this TensorFlow has not registered: " \
        "TotallyUnknownOp" in out
    assert "not timed: 1 node(s) (mm2): read an unregistered op's output" in out
    assert re.search(r"op signatures timed; \d+ node\(s\) kept float32; 2 node\(s\) not timed", out)
    # the rewrite's probe too: it says what it left out; the unknown op is kept float32
    with caplog.at_level(logging.INFO, logger="tf_amp"):
        assert cli.main(["rewrite", "--probe", *argv, str(source), str(tmp_path / "o.pbtxt")]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert any("probe did not time 1 node(s) (u)" in r.getMessage() for r in caplog.records)
    nodes = {n.name: n for n in cli.read_graph_def(str(tmp_path / "o.pbtxt")).node}
    assert nodes["u"].attr["T"].type == tf.float32.as_datatype_enum


def test_probe_rows_alike_but_for_attributes_say_which_is_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two MatMuls with the same input shapes, one transposing its second input, are two
    signatures timed apart; the table said ``MatMul[[8, 8], [8, 8]]`` twice."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")
        w = tf.constant(np.ones((8, 8), np.float32), name="w")
        tf.identity(tf.matmul(x, w) + tf.matmul(x, w, transpose_b=True), name="out")
    source = tmp_path / "two.pbtxt"
    cli.write_graph_def(graph.as_graph_def(), str(source))
    assert cli.main(["probe", "--target-dtype", "bfloat16", "--repeats", "1", str(source)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [i for i, line in enumerate(lines) if line.startswith("MatMul[[8, 8], [8, 8]]")]
    assert len(rows) == 2
    details = sorted(lines[i + 1].split() for i in rows)
    assert [words[-1] for words in details] == ["transpose_b=False", "transpose_b=True"]
    assert "transpose_a=False" in details[0] and "transpose_a=False" in details[1]


def test_probe_of_a_graph_tensorflow_cannot_import_says_it_could_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph_def = _matmul_graph_def()
    graph_def.node.add().CopyFrom(graph_def.node[0])  # a second node named "x"
    source = tmp_path / "dup.pb"
    cli.write_graph_def(graph_def, str(source))
    assert cli.main(["probe", "--target-dtype", "bfloat16", str(source)]) == 2
    err = capsys.readouterr().err
    assert f"the probe could not run on {source}: TensorFlow cannot import the graph" in err
    assert "Traceback" not in err


def test_rewrite_prints_each_report_line_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The summary goes to stdout; the logger's copy of it is held back during the command
    (its other records, like the unregistered-op warning, still go out), and only then."""
    from tf_amp.rewriter import rewrite_graph_def

    source = tmp_path / "unk.pbtxt"
    cli.write_graph_def(_graph_with_an_unregistered_op(), str(source))
    with caplog.at_level(logging.INFO, logger="tf_amp"):
        argv = ["rewrite", "--target-dtype", "float16", str(source), str(tmp_path / "o.pb")]
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        assert out.count("Converted") == 1 and out.count("target: float16") == 1
        messages = [r.getMessage() for r in caplog.records]
        assert not any("Converted" in m for m in messages)
        assert any("TensorFlow has not registered" in m for m in messages)
        caplog.clear()
        no_allow_ops = tf.Graph()  # unchanged at any target: nothing on the allow list
        with no_allow_ops.as_default():
            tf.reduce_sum(tf.compat.v1.placeholder(tf.float32, [4, 8], name="x"), name="out")
        unchanged = {"O0": _matmul_graph_def(), "O1": no_allow_ops.as_graph_def()}
        for opt_level, graph_def in unchanged.items():
            cli.write_graph_def(graph_def, str(source))
            argv = ["rewrite", "--opt-level", opt_level, str(source), str(tmp_path / "o.pb")]
            assert cli.main(argv) == 0
            assert capsys.readouterr().out.count("graph unchanged") == 1
        assert not any("unchanged" in r.getMessage() for r in caplog.records)
        rewrite_graph_def(graph_def)  # a library call after the command still logs
        assert any("unchanged" in r.getMessage() for r in caplog.records)


def test_a_target_forced_by_the_flag_is_named_as_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.pb"
    cli.write_graph_def(_matmul_graph_def(), str(source))
    target = str(tmp_path / "o.pb")
    assert cli.main(["rewrite", "--target-dtype", "bfloat16", str(source), target]) == 0
    assert "target: bfloat16 (bfloat16 was asked for (--target-dtype)" in capsys.readouterr().out
    assert cli.main(["lists", "--target-dtype", "float16"]) == 0
    assert "float16 was asked for (--target-dtype)" in capsys.readouterr().out
    # from the environment (the suite sets TF_AMP_TARGET_DTYPE), the config's own wording
    assert cli.main(["lists"]) == 0
    assert "(--target-dtype)" not in capsys.readouterr().out


def test_assets_named_like_the_top_level_files_are_copied(tmp_path: Path) -> None:
    # The copy skipped every file named saved_model.pb or fingerprint.pb, at any depth: the
    # rewritten model lost such assets and failed when it read them.
    for name in ("saved_model.pb", "fingerprint.pb"):
        (tmp_path / name).write_text(f"contents of {name}")

    class Reader(tf.Module):
        def __init__(self) -> None:
            self.assets = [tf.saved_model.Asset(str(tmp_path / n))
                           for n in ("saved_model.pb", "fingerprint.pb")]

        @tf.function(input_signature=[])
        def __call__(self) -> tf.Tensor:
            return tf.strings.join([tf.io.read_file(a) for a in self.assets], "|")

    source, target = tmp_path / "fp32", tmp_path / "amp"
    tf.saved_model.save(Reader(), str(source))
    assert cli.main(["rewrite", str(source), str(target), "--target-dtype", "float16"]) == 0
    assert tf.saved_model.load(str(target))().numpy() == (
        b"contents of saved_model.pb|contents of fingerprint.pb")


def test_a_log_dir_inside_in_or_out_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Inside OUT the logs were written, then deleted with the old OUT, while the command said
    # all was well; inside IN they were written into the user's model.
    source, target = tmp_path / "fp32", tmp_path / "amp"
    _saved_model(source)
    for inside in (target / "logs", source / "logs"):
        assert cli.main(["rewrite", str(source), str(target), "--log-dir", str(inside)]) == 2
        assert "is inside" in capsys.readouterr().err
        assert not inside.exists()
    assert cli.main(["rewrite", str(source), str(target), "--log-dir",
                     str(tmp_path / "logs")]) == 0
    assert any((tmp_path / "logs").iterdir())


def test_the_same_input_gives_the_same_bytes_in_every_process(tmp_path: Path) -> None:
    # Maps serialised in hash order: three processes wrote three different files.
    import os
    import subprocess
    import sys

    source = tmp_path / "fp32"
    _saved_model(source)
    graph = tmp_path / "in.pb"
    cli.write_graph_def(_matmul_graph_def(), str(graph))
    outputs = set()
    for seed in ("1", "2", "3"):
        code = ("from tf_amp import cli; import sys; "
                f"sys.exit(cli.main(['rewrite', r'{source}', r'{tmp_path / ('sm' + seed)}']) "
                f"or cli.main(['rewrite', r'{graph}', r'{tmp_path / ('g' + seed + '.pb')}']))")
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                       env={**os.environ, "PYTHONHASHSEED": seed, "TF_CPP_MIN_LOG_LEVEL": "2",
                            "TF_AMP_TARGET_DTYPE": "float16"})
        outputs.add(((tmp_path / f"sm{seed}" / "saved_model.pb").read_bytes(),
                     (tmp_path / f"g{seed}.pb").read_bytes()))
    assert len(outputs) == 1


def test_a_file_that_parses_to_no_node_is_not_a_graph_def(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "fp32"
    _saved_model(source)  # its fingerprint.pb parsed as a GraphDef of unknown fields
    assert cli.main(["rewrite", str(source / "fingerprint.pb"), str(tmp_path / "x.pb")]) == 2
    assert "holds no node: not a GraphDef" in capsys.readouterr().err
    assert not (tmp_path / "x.pb").exists()


def test_a_text_saved_model_is_refused_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "text_model"
    source.mkdir()
    (source / "saved_model.pbtxt").write_text("saved_model_schema_version: 1")
    assert cli.main(["rewrite", str(source), str(tmp_path / "out")]) == 2
    assert "holds a text SavedModel (saved_model.pbtxt)" in capsys.readouterr().err


def test_inspect_counts_only_what_the_rewrite_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A graph with the user's own float16 MatMul and Cast: inspect counted them as converted
    # by the rewrite ("MatMul 2", "1 to 16-bit" beside "Converted 1/... using 0 cast(s)").
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        h = tf.cast(x, tf.float16, name="users_cast")
        h = tf.matmul(h, tf.ones((8, 8), tf.float16), name="users_half_mm")
        y = tf.matmul(x, tf.ones((8, 8)), name="mm")
        tf.identity(tf.cast(h, tf.float32) + y, name="out")
    source, logs = tmp_path / "in.pb", tmp_path / "logs"
    cli.write_graph_def(graph.as_graph_def(), str(source))
    assert cli.main(["rewrite", str(source), str(tmp_path / "out.pb"), "--target-dtype",
                     "float16", "--log-dir", str(logs)]) == 0
    capsys.readouterr()
    assert cli.main(["inspect", str(logs)]) == 0
    text = capsys.readouterr().out
    by_type = text.split("by type:")[1].split("casts:")[0]
    assert re.search(r"MatMul\s+1\n", by_type), text
    summary = re.search(r"using (\d+) cast\(s\)", text)
    casts = re.search(r"casts: (\d+) to 16-bit", text)
    assert summary and casts and casts.group(1) == summary.group(1), text
