"""TensorFlow's real GPU auto_mixed_precision pass, run from the CUDA build in a second venv.

Not used by the rewrite: a reference for tests and benchmarks, like ``tests/_oracle.py`` (which
runs the CPU mode, ``auto_mixed_precision_cpu``, in this process). The pass users get on a GPU
is the CUDA mode, compiled only into the CUDA build of TensorFlow (pip ``tensorflow``); this
project's environment holds ``tensorflow-cpu``. ``scripts/make_oracle_venv.sh`` makes
``.venv-tf-gpu`` with the CUDA build, and ``run_gpu_pass`` runs ``_gpu_oracle_runner.py`` there
as a subprocess: every node placed on ``/device:GPU:0`` and a virtual cluster holding a GPU of
compute capability 8.0, so the pass runs exactly as on an A100 (no GPU is needed: Grappler
only asks the cluster).

``TF_AMP_GPU_ORACLE_PYTHON`` names another interpreter with the CUDA build, if wanted.
``TF_AMP_REQUIRE_GPU_ORACLE=1`` (set by ``.ci/run``) makes the tests fail instead of skip when
the oracle is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tensorflow.core.framework import graph_pb2

PYTHON_ENV = "TF_AMP_GPU_ORACLE_PYTHON"
REQUIRE_ENV = "TF_AMP_REQUIRE_GPU_ORACLE"
_REPO = Path(__file__).resolve().parent.parent
VENV_PYTHON = _REPO / ".venv-tf-gpu" / "bin" / "python"
RUNNER = Path(__file__).resolve().parent / "_gpu_oracle_runner.py"


def oracle_python() -> str | None:
    """The interpreter of the CUDA-build venv, or None when it has not been made."""
    explicit = os.environ.get(PYTHON_ENV, "").strip()
    if explicit:  # named on purpose: used as is, so a wrong path fails loudly
        return explicit
    return str(VENV_PYTHON) if os.access(VENV_PYTHON, os.X_OK) else None


def should_skip() -> bool:
    """True when the oracle is absent and not required (``TF_AMP_REQUIRE_GPU_ORACLE``)."""
    required = os.environ.get(REQUIRE_ENV, "").strip() not in ("", "0")
    return oracle_python() is None and not required


def missing_reason() -> str:
    """Why the GPU oracle cannot run (for a test's skip message)."""
    return (
        f"TensorFlow's GPU pass needs the CUDA build of TensorFlow in {VENV_PYTHON.parent.parent}"
        f" (or ${PYTHON_ENV}): run `bash scripts/make_oracle_venv.sh`"
    )


def run_gpu_pass(
    graph_def: graph_pb2.GraphDef,
    fetches: Iterable[str] = (),
    *,
    with_gpu: bool = True,
    vmodule: bool = False,
    architecture: str = "8.0",
) -> tuple[graph_pb2.GraphDef, str]:
    """(TensorFlow's GPU-pass rewrite of ``graph_def``, the subprocess's stderr).

    ``fetches`` are preserved, as a session's fetches would be. ``with_gpu=False`` runs the
    same call on a cluster with only a CPU (the pass then does nothing: a control).
    ``vmodule`` turns on the pass's own log (``TF_CPP_VMODULE=auto_mixed_precision=2``).
    Raises RuntimeError with the subprocess's output when it fails.
    """
    python = oracle_python()
    if python is None:
        raise RuntimeError(missing_reason())
    with tempfile.TemporaryDirectory(prefix="tf_amp_gpu_oracle_") as tmp:
        graph_path = os.path.join(tmp, "graph.pb")
        out_path = os.path.join(tmp, "out.pb")
        spec_path = os.path.join(tmp, "spec.json")
        with open(graph_path, "wb") as f:
            f.write(graph_def.SerializeToString())
        spec = {
            "graph": graph_path,
            "out": out_path,
            "fetches": sorted(set(fetches)),
            "architecture": architecture,
            "with_gpu": with_gpu,
        }
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ)
        env["TF_CPP_MIN_LOG_LEVEL"] = "0" if vmodule else "2"
        if vmodule:
            env["TF_CPP_VMODULE"] = "auto_mixed_precision=2"
        env.pop("PYTHONPATH", None)
        proc = subprocess.run(
            [python, str(RUNNER), spec_path], env=env, capture_output=True, text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"GPU oracle failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        out = graph_pb2.GraphDef()
        with open(out_path, "rb") as f:
            out.ParseFromString(f.read())
        return out, proc.stderr


if __name__ == "__main__":  # python -m tests._gpu_oracle: is the oracle there?
    print(oracle_python() or missing_reason())
    sys.exit(0 if oracle_python() else 1)
