"""The "Converted X/Y nodes ..." line is visible by default, and never printed twice."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

REWRITE_A_MATMUL = """
    import tensorflow as tf
    import tf_amp

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 2], name="x")
        tf.identity(tf.matmul(x, x), name="y")
    tf_amp.rewrite_graph_def(graph.as_graph_def())
"""


@pytest.mark.parametrize("configure_logging", [False, True], ids=["unconfigured", "basicConfig"])
def test_conversion_line_is_printed_exactly_once(configure_logging):
    prelude = ("import logging; logging.basicConfig(level=logging.WARNING, "
               "format='app %(name)s %(message)s')\n") if configure_logging else ""
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(REWRITE_A_MATMUL)],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, capture_output=True, text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if "Converted" in line]
    assert len(lines) == 1, result.stderr[-2000:]
    expected_prefix = "app tf_amp Converted" if configure_logging else "tf_amp: Converted"
    assert lines[0].startswith(expected_prefix)
    assert lines[0].endswith("cast(s) to float16 (excluding Const and Variable casts)")
