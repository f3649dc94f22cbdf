"""Differential tests for the bfloat16 target: our rewrite vs TensorFlow's oneDNN pass.

Oracle: ``tf_optimizer.OptimizeGraph`` with only ``auto_mixed_precision_onednn_bfloat16`` (the
pass ``tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16":
True})`` turns on), on the training-step graphs of ``tests/_model_graphs.py``. Our bfloat16
lists are TensorFlow's oneDNN lists, and TensorFlow runs its "infer op directly following an
allow op" pass in this mode too, so with Const folding off (TensorFlow casts Consts; we fold
them, a measured choice) every float32 vertex must get the same dtype and every Cast must match.
(The normalization guard, ``tf_amp.painter.normalization_guard``, is a float16 default only: for
bfloat16 it stays an option until measured faster. The update guard,
``tf_amp.painter.update_guard``, is bfloat16's measured departure: the exact comparison turns
it off, and a second test checks that with the defaults it is the only difference.)

TensorFlow runs the pass only with its oneDNN kernels on (the suite turns them off for
determinism, so the oracle runs in a subprocess with TensorFlow's default) and where oneDNN can
run bfloat16 (a CPU with AVX512-BF16 or AMX, or AVX-512 for its emulation); elsewhere the pass
leaves the graph alone and the tests skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorflow.core.framework import graph_pb2

from tests import _model_graphs, _oracle
from tf_amp.config import RewriteConfig
from tf_amp.rewriter import rewrite_graph_def
from tf_amp.runtime._graphdef import grappler_request

GRAPHS = ["keras_cnn", "transformer", "tf1_while_momentum"]


_ORACLE = """
import sys
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
from tensorflow.python.grappler import tf_optimizer
config, meta = config_pb2.ConfigProto(), meta_graph_pb2.MetaGraphDef()
config.ParseFromString(open(sys.argv[1], "rb").read())
meta.ParseFromString(open(sys.argv[2], "rb").read())
open(sys.argv[3], "wb").write(tf_optimizer.OptimizeGraph(config, meta).SerializeToString())
"""


def tensorflow_bf16_pass(model: _model_graphs.ModelGraph, tmp: Path) -> graph_pb2.GraphDef:
    """TensorFlow's oneDNN bfloat16 pass on ``model``, run with oneDNN as TensorFlow defaults."""
    config, meta = grappler_request(
        model.graph_def, model.fetches, ["auto_mixed_precision_onednn_bfloat16"]
    )
    paths = [tmp / "config.pb", tmp / "meta.pb", tmp / "out.pb"]
    paths[0].write_bytes(config.SerializeToString())
    paths[1].write_bytes(meta.SerializeToString())
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    subprocess.run(
        [sys.executable, "-c", _ORACLE, *map(str, paths)], env=env, check=True, timeout=300
    )
    out = graph_pb2.GraphDef()
    out.ParseFromString(paths[2].read_bytes())
    return out


_THEIRS: dict[str, tuple[_model_graphs.ModelGraph, graph_pb2.GraphDef]] = {}


def theirs_for(name: str, tmp: Path) -> tuple[_model_graphs.ModelGraph, graph_pb2.GraphDef]:
    """The model and TensorFlow's rewrite of it; skips where TensorFlow's pass does not run."""
    if name not in _THEIRS:  # node names differ from one build to the next: keep the model
        model = _model_graphs.ALL_BUILDERS[name]()
        _THEIRS[name] = (model, tensorflow_bf16_pass(model, tmp))
    model, theirs = _THEIRS[name]
    if not _oracle.count_new_casts(model.graph_def, theirs)["to_half"]:
        pytest.skip("TensorFlow's oneDNN bfloat16 pass does not run on this CPU")
    return model, theirs


@pytest.mark.parametrize("name", GRAPHS)
def test_bfloat16_painting_equals_tensorflows_onednn_pass(name: str, tmp_path: Path) -> None:
    model, theirs = theirs_for(name, tmp_path)
    config = RewriteConfig(
        target_dtype="bfloat16",
        preserve_nodes=frozenset(model.fetches),
        infer_follows_allow=True,
        fold_constant_casts=False,
        guard_updates=False,
        select_before_cast=False,
    )
    ours = rewrite_graph_def(model.graph_def, config).graph_def
    comparison = _oracle.compare(model.graph_def, ours, theirs)
    print(f"\n{name}: {comparison.vertices} float32 vertices, {comparison.differing} differ; "
          f"casts ours {comparison.ours_casts} vs TF {comparison.tf_casts}")
    assert comparison.vertices > 50
    assert comparison.only_ours_half == []
    assert comparison.only_tf_half == []
    assert comparison.ours_casts == comparison.tf_casts


@pytest.mark.parametrize("name", GRAPHS)
def test_bfloat16_default_departs_only_by_the_update_guard(name: str, tmp_path: Path) -> None:
    """With the defaults (Const folding off, to compare vertex for vertex), every vertex that
    differs from TensorFlow's pass is update-only arithmetic TensorFlow paints bfloat16 and we
    keep float32, and we insert no more Casts than TensorFlow."""
    model, theirs = theirs_for(name, tmp_path)
    config = RewriteConfig(target_dtype="bfloat16", preserve_nodes=frozenset(model.fetches),
                           fold_constant_casts=False)
    assert config.guards_updates
    result = rewrite_graph_def(model.graph_def, config)
    comparison = _oracle.compare(model.graph_def, result.graph_def, theirs)
    buckets = _oracle.classify(result, comparison)
    print(f"\n{name}: {len(buckets[_oracle.UPDATE_GUARD])} update-only vertices kept float32; "
          f"casts ours {comparison.ours_casts} vs TF {comparison.tf_casts}")
    assert comparison.only_ours_half == []
    assert set(comparison.only_tf_half) == set(buckets[_oracle.UPDATE_GUARD])
    assert buckets[_oracle.UPDATE_GUARD], "every test graph has an optimizer step TF paints"
    assert comparison.ours_casts["to_half"] <= comparison.tf_casts["to_half"]
    assert comparison.ours_casts["to_float"] <= comparison.tf_casts["to_float"]
