"""The graphs a rewrite logs open in TensorBoard: shown in a real browser, not assumed.

Runs ``scripts/check_tensorboard_graphs.py`` (a rewrite's logs, ``tensorboard --logdir`` on
loopback, headless Chromium on the Graphs tab; its docstring says what it checks) and reads its
report. Skips only when no Chromium is installed (``apt-get install chromium``; ``.ci/run``
installs it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "scripts", "check_tensorboard_graphs.py",
)


def _script_module():
    spec = importlib.util.spec_from_file_location("check_tensorboard_graphs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # stdlib imports only at module level
    return module


def test_logged_graphs_open_in_tensorboard(tmp_path) -> None:
    if _script_module().find_chromium() is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, "--out", str(out), "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    try:
        stdout, stderr = proc.communicate(timeout=480)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the script then stops the TensorBoard and Chromium it started
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"the check took over 480 s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    report_path = out / "report.json"
    assert report_path.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert result.returncode == 0 and report["ok"], report.get("error", result.stderr[-3000:])

    stamp = report["logged"]["stamp"]
    runs = [f"{stamp}/after", f"{stamp}/before"]
    # TensorBoard's HTTP API serves both runs' graphs, node for node the logged ones.
    assert report["http"]["runs"] == runs
    http = report["http"]["graphs"]
    assert http["after"]["tf_amp_casts"] > 0 and http["before"]["tf_amp_casts"] == 0
    assert http["after"]["nodes"] > http["before"]["nodes"]
    # The browser: the Graphs tab lists both runs, and each, chosen from the Run menu, is drawn
    # from a model holding exactly the logged graph's nodes; tf_amp's casts only in "after".
    pages = report["chromium"]["pages"]
    for kind in ("before", "after"):
        page = pages[kind]
        assert page["run"] == f"{stamp}/{kind}"
        assert page["runs_in_menu"] == runs
        assert page["model_nodes"] == http[kind]["nodes"]
        assert page["scene_nodes"] > 0
        assert (out / f"graphs_{kind}.png").stat().st_size > 10_000  # a screenshot, not blank
    assert pages["after"]["tf_amp_casts_drawn"] and not pages["before"]["tf_amp_casts_drawn"]
