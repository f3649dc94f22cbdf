"""The supported TensorFlow / Keras range: the installed pair passes, others get one error
that names the range (the checking function takes the versions as arguments: no mocking)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tf_amp._upstream import versions
from tf_amp._upstream.versions import UnsupportedVersionError, check_versions


def test_the_installed_tensorflow_and_keras_are_supported() -> None:
    import keras
    import tensorflow as tf

    check_versions(tf.__version__, keras.__version__)  # raises if not


def test_importing_the_upstream_doors_passes_the_check() -> None:
    from tf_amp._upstream import keras as upstream_keras
    from tf_amp._upstream import tensorflow as upstream_tf

    assert upstream_tf.Session is not None and upstream_keras.Trainer is not None


@pytest.mark.parametrize(
    ("tensorflow_version", "keras_version", "named"),
    [
        ("2.15.0", "2.15.0", "TensorFlow 2.15.0 and Keras 2.15.0 are installed"),
        ("2.18.1", "3.8.0", "TensorFlow 2.18.1 is installed"),
        ("2.22.0", "3.15.1", "TensorFlow 2.22.0 is installed"),
        ("2.22.0rc0", None, "TensorFlow 2.22.0rc0 is installed"),
        ("2.21.0", "3.6.0", "Keras 3.6.0 is installed"),
        ("2.21.0", "3.16.0", "Keras 3.16.0 is installed"),
        ("2.21.0", "4.0.0", "Keras 4.0.0 is installed"),
        ("nightly", "3.10.0", "TensorFlow nightly is installed"),
    ],
)
def test_an_unsupported_version_gets_one_error_naming_the_range(
    tensorflow_version: str, keras_version: str | None, named: str
) -> None:
    with pytest.raises(UnsupportedVersionError) as info:
        check_versions(tensorflow_version, keras_version)
    message = str(info.value)
    assert "tf_amp supports TensorFlow >=2.19,<2.22 with Keras >=3.7,<3.16" in message
    assert named in message
    assert versions.ENV_ALLOW_UNSUPPORTED in message  # says how to go on anyway


@pytest.mark.parametrize(
    ("tensorflow_version", "keras_version"),
    [("2.19.0", "3.7.0"), ("2.20.0", "3.10.0"), ("2.21.0", "3.15.1"), ("2.21.1rc1", None),
     ("2.19", "3.8")],
)
def test_every_release_in_the_range_passes(tensorflow_version: str, keras_version: str) -> None:
    check_versions(tensorflow_version, keras_version)


def test_the_range_is_one_constant_per_upstream_and_the_error_is_an_import_error() -> None:
    assert versions.TENSORFLOW_RANGE == (">=2.19", "<2.22")
    assert versions.KERAS_RANGE == (">=3.7", "<3.16")
    assert issubclass(UnsupportedVersionError, ImportError)


def test_allowing_unsupported_versions_turns_the_error_into_a_warning(monkeypatch) -> None:
    monkeypatch.setenv(versions.ENV_ALLOW_UNSUPPORTED, "1")
    with pytest.warns(UserWarning, match="tf_amp supports TensorFlow"):
        versions.enforce("2.15.0", "2.15.0")
    monkeypatch.setenv(versions.ENV_ALLOW_UNSUPPORTED, "0")
    with pytest.raises(UnsupportedVersionError):
        versions.enforce("2.15.0", "2.15.0")


def test_pyproject_readme_and_architecture_state_the_same_range() -> None:
    root = Path(__file__).resolve().parent.parent
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"keras{",".join(versions.KERAS_RANGE)}"' in pyproject
    assert f'"tensorflow{",".join(versions.TENSORFLOW_RANGE)}"' in pyproject
    assert versions.describe_range() in (root / "README.md").read_text(encoding="utf-8")
    # ARCHITECTURE.md quotes the two constants as written in versions.py.
    architecture = (root / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    for name, (low, high) in (("TENSORFLOW_RANGE", versions.TENSORFLOW_RANGE),
                              ("KERAS_RANGE", versions.KERAS_RANGE)):
        assert f'`{name} = ("{low}", "{high}")`' in architecture, name
