"""GraphDef files: read binary or text, write by suffix."""

from __future__ import annotations

import os
from typing import Any

TEXT_SUFFIXES = (".pbtxt", ".txt", ".pb.txt")


def read_graph_def(path: str) -> Any:
    """A GraphDef from a binary or text file (text by suffix, else tried as both)."""
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    data = read_bytes(path)
    if not data.strip():  # parses as a GraphDef of nothing, and would be "rewritten" as one
        raise ValueError(f"{path} is empty: not a GraphDef")
    if path.endswith(TEXT_SUFFIXES):
        try:
            text_format.Parse(data.decode("utf-8"), graph_def)
        except (text_format.ParseError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is not a text GraphDef: {error}") from None
        return _with_nodes(graph_def, path)
    try:
        graph_def.ParseFromString(data)
    except Exception:  # noqa: BLE001 - fall back to text, then report both failures
        try:
            text_format.Parse(data.decode("utf-8"), graph_def)
        except Exception as error:
            raise ValueError(f"{path} is neither a binary nor a text GraphDef") from error
    return _with_nodes(graph_def, path)


def _with_nodes(graph_def: Any, path: str) -> Any:
    """``graph_def``, or a ValueError when it holds no node: another message's bytes can parse
    as a GraphDef whose fields are all unknown (a fingerprint.pb did), and a graph of nothing
    would be "rewritten" as one."""
    if not graph_def.node and not graph_def.library.function:
        raise ValueError(f"{path} holds no node: not a GraphDef")
    return graph_def


def write_graph_def(graph_def: Any, path: str) -> None:
    from google.protobuf import text_format

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(TEXT_SUFFIXES):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text_format.MessageToString(graph_def))
    else:
        with open(path, "wb") as f:  # the same input and config give the same bytes
            f.write(graph_def.SerializeToString(deterministic=True))


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def check_preserved(graph_def: Any, preserve: frozenset[str], source: str) -> None:
    """Raises ValueError when ``--preserve`` names a node ``source``'s graph does not have:
    the list replaces the default (the graph's outputs), so a mistyped name would let an
    output turn half, in a file written as if all were well."""
    missing = preserve.difference(node.name for node in graph_def.node)
    if missing:
        raise ValueError(
            f"--preserve names node(s) {source} does not have: {', '.join(sorted(missing))}"
        )
