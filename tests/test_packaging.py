"""Packaging: one version, and the metadata the installed distribution really carries."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import tf_amp

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_the_installed_distributions() -> None:
    # pyproject.toml reads the version from tf_amp.__version__, so an edit there must reach
    # the installed metadata (the editable install is rebuilt by scripts/setup.sh).
    assert tf_amp.__version__ == importlib.metadata.version("tf_amp")


def test_version_is_written_once() -> None:
    # By text: tomllib is Python >= 3.11 and the project supports 3.10.
    text = (ROOT / "pyproject.toml").read_text()
    project = re.search(r"^\[project\]\n(.*?)(?=^\[)", text, re.M | re.S).group(1)
    assert not re.search(r"^version\s*=", project, re.M)
    assert re.search(r'^dynamic\s*=\s*\[[^]]*"version"', project, re.M)
    assert 'version = {attr = "tf_amp.__version__"}' in text


def test_licence_is_in_the_installed_metadata() -> None:
    # setup.py writes it in the form the build's setuptools reads (SPDX expression from 77 on).
    metadata = importlib.metadata.metadata("tf_amp")
    assert "Apache-2.0" in (metadata.get("License-Expression"), metadata.get("License"))


def test_the_package_ships_no_test_helpers() -> None:
    # The references the tests compare the rewrite with (TensorFlow's own pass, the model
    # graphs) live in tests/, not in the package: every module under the packages that
    # pyproject.toml's `packages.find` selects goes into the wheel.
    from setuptools import find_packages

    packages = find_packages(str(ROOT), include=["tf_amp*"])
    shipped = [
        path
        for package in packages
        for path in (ROOT / package.replace(".", "/")).glob("*.py")
    ]
    assert shipped, packages
    names = {path.stem for path in shipped}
    assert not names & {"_oracle", "_gpu_oracle", "_gpu_oracle_runner", "_model_graphs"}
    for path in shipped:
        text = path.read_text()
        assert "from tests" not in text and "import pytest" not in text, path
