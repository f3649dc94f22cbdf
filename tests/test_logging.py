"""What a user reads: the "Converted X/Y nodes ..." line in one form however logging is set up,
printed once, and a "nothing to do" line that says which graph it is about.

Each case runs in a fresh interpreter: logging set-up is process-wide, and the suite itself
takes over tf_amp's logger (conftest.py) so that caplog sees its records.
"""

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

CONVERTED = ("tf_amp: Converted 2/3 nodes to float16 precision using 1 cast(s) to float16 "
             "(excluding Const and Variable casts)")

# How applications and libraries set up logging before tf_amp logs anything. Each used to
# change the line: "INFO:tf_amp:Converted ..." after basicConfig(), absl's
# "I1125 12:00:00.000 123 rewriter.py:215] Converted ..." once absl's handler is in use.
PRELUDES = {
    "unconfigured": "",
    "basicConfig": "import logging; logging.basicConfig()\n",
    "basicConfig_info_app_format": (
        "import logging; logging.basicConfig(level=logging.INFO, "
        "format='app %(levelname)s %(name)s %(message)s')\n"
    ),
    "absl_imported": "import absl.logging\n",
    "absl_handler_in_use": (
        "import logging, absl.logging\n"
        "absl.logging.use_absl_handler()\n"
        "absl.logging.set_verbosity(absl.logging.INFO)\n"
    ),
}


def _run(code: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_AMP_TARGET_DTYPE": "float16"},
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result


@pytest.mark.parametrize("prelude", list(PRELUDES.values()), ids=list(PRELUDES))
def test_conversion_line_keeps_one_form_and_is_printed_once(prelude: str) -> None:
    result = _run(prelude + textwrap.dedent(REWRITE_A_MATMUL))
    lines = [line for line in result.stderr.splitlines() if "Converted" in line]
    assert lines == [CONVERTED], result.stderr[-2000:]


def test_application_can_take_the_records_over() -> None:
    # The documented way: propagate to the application's handlers, which then print it alone.
    prelude = (
        "import logging; logging.basicConfig(level=logging.WARNING, "
        "format='app %(name)s %(message)s')\n"
        "import tf_amp; logging.getLogger('tf_amp').propagate = True\n"
    )
    result = _run(prelude + textwrap.dedent(REWRITE_A_MATMUL))
    lines = [line for line in result.stderr.splitlines() if "Converted" in line]
    assert lines == [CONVERTED.replace("tf_amp: ", "app tf_amp ")], result.stderr[-2000:]


def test_nothing_to_do_names_the_graph() -> None:
    code = textwrap.dedent("""
        import tensorflow as tf
        import tf_amp

        v = tf.Variable([1.0, 2.0, 3.0])

        def scaled_sum(t):
            return tf.reduce_sum(t * v) + 1.0

        tf_amp.function(scaled_sum)(tf.constant([1.0, 1.0, 1.0]))
        graph = tf.Graph()
        with graph.as_default():
            tf.exp(tf.compat.v1.placeholder(tf.float32, [2], name="x"), name="e")
        tf_amp.rewrite_graph_def(graph.as_graph_def())
    """)
    lines = [line for line in _run(code).stderr.splitlines() if "nothing to do" in line]
    assert len(lines) == 2, lines
    assert lines[0].startswith("tf_amp: no allow-list ops found in graph 'scaled_sum' of ")
    assert lines[1] == ("tf_amp: no allow-list ops found in the graph of 2 node(s), "
                        "nothing to do (graph unchanged)")


def test_nothing_to_do_says_why_the_allow_list_ops_stayed_float32() -> None:
    # A graph whose MatMuls were all kept float32 (here by exclude_scopes; the probe's
    # "measured slower" is the other common cause) is not a graph without allow-list ops:
    # the line used to say "no allow-list ops found".
    code = textwrap.dedent("""
        import tensorflow as tf
        import tf_amp

        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [2, 2], name="x")
            with tf.name_scope("head"):
                y = tf.matmul(tf.matmul(x, x), x)
            tf.identity(y, name="y")
        tf_amp.rewrite_graph_def(
            graph.as_graph_def(),
            config=tf_amp.RewriteConfig(target_dtype="float16", exclude_scopes=("head",)),
        )
    """)
    lines = [line for line in _run(code).stderr.splitlines() if "nothing to do" in line]
    assert lines == ["tf_amp: all 2 allow-list op(s) in the graph of 4 node(s) kept float32 "
                     "(2 excluded), nothing to do (graph unchanged)"]
