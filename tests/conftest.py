"""Shared test set-up: quiet TensorFlow's C++ logging before it is imported, and make sure no
test leaves the process-wide rewrite switch (and its Keras compile hook) on for the next one."""

import logging
import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# Every way in defaults to the "auto" target, which depends on the machine (bfloat16 on a CPU
# with AMX/AVX512-BF16, float32 on one without). The suite pins float16 so that each test means
# the same on every machine; the tests of "auto" itself (test_target.py) unset it.
os.environ.setdefault("TF_AMP_TARGET_DTYPE", "float16")
# The suite takes over tf_amp's logging the documented way, so that pytest's caplog (a handler
# on the root logger) sees its records; test_logging.py checks the default in subprocesses.
import tf_amp  # noqa: E402, F401 - cheap (lazy exports); installs tf_amp's log handler

logging.getLogger("tf_amp").propagate = True


@pytest.fixture(autouse=True)
def _rewrite_switch_off_after_each_test():
    yield
    enable = sys.modules.get("tf_amp.enable")  # only if a test used it: importing costs TF
    if enable is not None:
        enable.disable_mixed_precision_graph_rewrite()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """How many workers ``-n auto`` (pyproject's addopts) starts: one per core this process may
    use, at most 4, and none (the suite runs in this process) on one core.

    Why parallel: most of the suite's time is single-threaded Python (graph walks, tracing, and
    the many tests that start a fresh interpreter to import TensorFlow), so two workers on a
    2-core machine took the suite from 16.6 to 10.5 min. Why at most 4: each worker is a
    TensorFlow process (~0.6 GB after a small Keras fit) whose thread pools already use every
    core, and several tests start more of them. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still sets
    the number: then pytest-xdist's own hook reads it (returning None hands over to it).
    """
    del config  # the choice depends on the machine only
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    return 0 if cores == 1 else min(cores, 4)
