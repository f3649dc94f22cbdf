"""Rewriting a SavedModel: every MetaGraph's GraphDef and library, variables copied unchanged."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from tf_amp.cli.graph_files import check_preserved, read_bytes

_FINGERPRINT = "fingerprint.pb"
# Marks a directory as written by `tf-amp rewrite`, so a later run may replace it
# (assets.extra is where a SavedModel keeps files TensorFlow does not read).
_MARKER = os.path.join("assets.extra", "tf_amp_rewrite.json")


def rewrite_saved_model(source: str, target: str, config: Any) -> Any:
    """Copies a SavedModel, rewriting every MetaGraph's GraphDef and function library.

    Variables and assets are copied unchanged: the rewrite never changes a variable's name or
    dtype, so the checkpoint in ``variables/`` still matches. Signature inputs and outputs, and
    what a collection names, are preserved (their dtypes do not change): their nodes are added
    to ``preserve_nodes``.
    Returns one report per MetaGraph.

    OUT is replaced only when it is an earlier output of this command (it carries the
    ``assets.extra/tf_amp_rewrite.json`` marker) or an empty directory, and never when it is or
    contains IN: anything else there is the user's, and is not ours to delete.
    """
    from tf_amp.rewriter import rewrite_graph_def

    pb_path = os.path.join(source, "saved_model.pb")
    if not os.path.exists(pb_path):
        if os.path.exists(os.path.join(source, "saved_model.pbtxt")):
            raise ValueError(
                f"{source} holds a text SavedModel (saved_model.pbtxt); tf-amp rewrites binary "
                "ones: save it again without as_text"
            )
        raise FileNotFoundError(f"{source} is a directory without saved_model.pb")
    _check_saved_model_target(source, target)
    _check_log_dir(source, target, config.log_dir)
    saved_model = _read_saved_model(pb_path)
    check_preserved(_all_nodes(saved_model), config.preserve_nodes, pb_path)
    reports = []
    for meta_graph in saved_model.meta_graphs:
        keep = {
            name.split(":")[0]
            for signature in meta_graph.signature_def.values()
            for tensor in list(signature.outputs.values()) + list(signature.inputs.values())
            for name in _tensor_names(tensor)
        } | _collection_nodes(meta_graph)
        effective = config.replace(preserve_nodes=frozenset(config.preserve_nodes) | keep)
        result = rewrite_graph_def(meta_graph.graph_def, effective)
        meta_graph.graph_def.CopyFrom(result.graph_def)
        reports.append(result.report)
    # Written whole beside OUT, then moved in: an earlier output is replaced only by a
    # complete one (a copy that fails leaves it as it was).
    partial = os.path.normpath(target) + ".tf-amp-partial"
    if os.path.exists(partial):
        shutil.rmtree(partial)
    # fingerprint.pb describes the original saved_model.pb: it is made anew below. Only the
    # top level's: an asset may have either name.
    top = os.path.realpath(source)

    def ignore(directory: str, names: list[str]) -> set[str]:
        if os.path.realpath(directory) != top:
            return set()
        return {"saved_model.pb", _FINGERPRINT} & set(names)

    try:
        shutil.copytree(source, partial, ignore=ignore)
        with open(os.path.join(partial, "saved_model.pb"), "wb") as f:
            f.write(saved_model.SerializeToString(deterministic=True))  # as TensorFlow does
        if os.path.exists(os.path.join(source, _FINGERPRINT)):
            _write_fingerprint(partial)
        marker = os.path.join(partial, _MARKER)
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(marker, "w", encoding="utf-8") as f:
            json.dump({"rewritten_from": os.path.abspath(source), "tool": "tf-amp rewrite"}, f)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if os.path.exists(target):
        shutil.rmtree(target)
    os.replace(partial, target)
    return reports


def _collection_nodes(meta_graph: Any) -> set[str]:
    """The nodes a TF1 MetaGraph's collections name (``node_list``: tensors and ops a loader
    fetches by ``tf.compat.v1.get_collection``, such as a model's ``predictions``), which keep
    their dtypes as the signatures' do: rewritten, such a tensor came back float16. Names of
    nodes the graph lacks (a collection may name a function's op) are left out."""
    nodes = {node.name for node in meta_graph.graph_def.node}
    named = {
        value.lstrip("^").split(":")[0]
        for collection in meta_graph.collection_def.values()
        if collection.WhichOneof("kind") == "node_list"
        for value in collection.node_list.value
    }
    return named & nodes


def _tensor_names(info: Any) -> list[str]:
    """The graph tensors a signature's ``TensorInfo`` stands for: its ``name``, or a
    SparseTensor's three (``coo_sparse``), or a composite's components, recursively. The
    first alone missed the others, and a SparseTensor output came back float16."""
    encoding = info.WhichOneof("encoding")
    if encoding == "coo_sparse":
        sparse = info.coo_sparse
        names = [
            sparse.values_tensor_name, sparse.indices_tensor_name, sparse.dense_shape_tensor_name
        ]
    elif encoding == "composite_tensor":
        names = [n for part in info.composite_tensor.components for n in _tensor_names(part)]
    else:
        names = [info.name]
    return [name for name in names if name]


def _all_nodes(saved_model: Any) -> Any:
    """One GraphDef holding every MetaGraph's main-graph nodes: a ``--preserve`` name must be
    in one of them (it may belong to the serving graph only), before any is rewritten."""
    from tensorflow.core.framework import graph_pb2

    union = graph_pb2.GraphDef()
    for meta_graph in saved_model.meta_graphs:
        union.node.extend(meta_graph.graph_def.node)
    return union


def _read_saved_model(pb_path: str) -> Any:
    """The SavedModel proto in ``pb_path``; a ValueError naming the file when it does not parse
    (a truncated copy, another file under that name), like the GraphDef reader's, or holds no
    MetaGraph (an empty file parses as one; there would be nothing to rewrite or load)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    try:
        saved_model.ParseFromString(read_bytes(pb_path))
    except DecodeError as error:
        raise ValueError(f"{pb_path} is not a binary SavedModel ({error})") from None
    if not saved_model.meta_graphs:
        raise ValueError(f"{pb_path} is not a SavedModel: it holds no MetaGraph")
    return saved_model


def _check_saved_model_target(source: str, target: str) -> None:
    """Refuses an OUT whose replacement would destroy IN or files that are not ours."""
    if os.path.islink(target):  # replaced as a whole: rmtree refuses a link, after the work
        raise FileExistsError(f"OUT {target} is a symbolic link; give the directory itself")
    source_path, target_path = os.path.realpath(source), os.path.realpath(target)
    if source_path == target_path:
        raise ValueError("OUT must differ from IN (the SavedModel is copied, not edited)")
    if os.path.commonpath([source_path, target_path]) == target_path:
        raise ValueError(f"OUT {target} contains IN {source}; it would be deleted")
    if os.path.commonpath([source_path, target_path]) == source_path:
        raise ValueError(
            f"OUT {target} is inside IN {source}; the output would be written into the "
            "user's model (and copied along by the next rewrite of it)"
        )
    if os.path.isdir(target) and os.listdir(target):
        if not os.path.exists(os.path.join(target, _MARKER)):
            raise FileExistsError(
                f"OUT {target} is a non-empty directory that tf-amp did not write; remove it "
                "or choose another path (only an earlier tf-amp output is replaced)"
            )
    elif os.path.exists(target) and not os.path.isdir(target):
        raise FileExistsError(f"OUT {target} is a file; a SavedModel is a directory")


def _check_log_dir(source: str, target: str, log_dir: str | None) -> None:
    """Refuses a ``--log-dir`` inside IN (the logs would be written into the user's model, and
    copied into OUT) or inside OUT (written during the rewrite, then deleted when OUT is
    replaced by the copy, while the command said it wrote them)."""
    if not log_dir:
        return
    logs = os.path.realpath(log_dir)
    for role, path in (("IN", source), ("OUT", target)):
        root = os.path.realpath(path)
        if os.path.commonpath([root, logs]) == root:
            raise ValueError(
                f"--log-dir {log_dir} is inside {role} {path}; give a directory outside both "
                "SavedModels"
            )


def _write_fingerprint(export_dir: str) -> None:
    """Writes the fingerprint of the rewritten SavedModel, as tf.saved_model.save does."""
    from tf_amp._upstream.tensorflow import fingerprinting

    serialized = fingerprinting.CreateFingerprintDef(export_dir)
    with open(os.path.join(export_dir, _FINGERPRINT), "wb") as f:
        f.write(serialized)
