"""The TensorFlow and Keras releases tf_amp supports, and the check that enforces them.

Why a check at all: tf_amp touches internals of both (see :mod:`tf_amp._upstream`), and a
release that moved one of them would otherwise fail with an AttributeError in the middle of a
training step. Checked once per process, when TensorFlow or Keras is first used through
``tf_amp._upstream`` (which every module that touches them imports first), so ``import tf_amp``
alone, and the startup hook, stay free of TensorFlow.

Set ``TF_AMP_ALLOW_UNSUPPORTED_VERSIONS=1`` to try other releases anyway: the check then warns
instead of raising.

Standard library only (and tf_amp's flag parser, itself standard library only).
"""

from __future__ import annotations

import os
import re
import warnings

from tf_amp._flags import parse_flag

TENSORFLOW_RANGE = (">=2.19", "<2.22")
"""TensorFlow releases tf_amp is tested with (lower bound inclusive, upper exclusive)."""

KERAS_RANGE = (">=3.7", "<3.16")
"""Keras releases tf_amp is tested with: Keras 3, the one TensorFlow 2.16+ uses by default."""

ENV_ALLOW_UNSUPPORTED = "TF_AMP_ALLOW_UNSUPPORTED_VERSIONS"


class UnsupportedVersionError(ImportError):
    """The installed TensorFlow or Keras is outside the range tf_amp supports."""


def _bound(spec: str) -> tuple[int, ...]:
    return tuple(int(part) for part in spec.lstrip("<>=").split("."))


def _release(version: str) -> tuple[int, ...] | None:
    """``"2.21.0rc1"`` -> ``(2, 21, 0)``; None for a string with no leading number."""
    found = re.match(r"\s*(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def in_range(version: str, version_range: tuple[str, str]) -> bool:
    """True when ``version`` (as ``__version__`` spells it) lies in ``version_range``.

    Release numbers are compared by their components, pre-release and dev suffixes ignored
    (``2.22.0rc0`` is 2.22), and padded with zeros (``3.8`` is ``3.8.0``).
    """
    release = _release(version)
    if release is None:
        return False
    low, high = (_bound(spec) for spec in version_range)

    def padded(parts: tuple[int, ...]) -> tuple[int, ...]:
        return parts + (0,) * (4 - len(parts))

    return padded(low) <= padded(release) < padded(high)


def describe_range() -> str:
    """The supported range in words, e.g. for a README or an error message."""
    return (
        f"TensorFlow {','.join(TENSORFLOW_RANGE)} with Keras {','.join(KERAS_RANGE)}"
    )


def check_versions(tensorflow_version: str, keras_version: str | None = None) -> None:
    """Raises :class:`UnsupportedVersionError` naming the supported range when either version
    is outside it. ``keras_version`` None means "not known yet" (it is checked on its own when
    Keras is first used)."""
    problems = []
    if not in_range(tensorflow_version, TENSORFLOW_RANGE):
        problems.append(f"TensorFlow {tensorflow_version}")
    if keras_version is not None and not in_range(keras_version, KERAS_RANGE):
        problems.append(f"Keras {keras_version}")
    if problems:
        raise UnsupportedVersionError(
            f"tf_amp supports {describe_range()}, but {' and '.join(problems)} "
            f"{'is' if len(problems) == 1 else 'are'} installed. Install a supported release "
            f"(pip install 'tensorflow{','.join(TENSORFLOW_RANGE)}' "
            f"'keras{','.join(KERAS_RANGE)}'), or set {ENV_ALLOW_UNSUPPORTED}=1 to try anyway."
        )


def enforce(tensorflow_version: str, keras_version: str | None = None) -> None:
    """:func:`check_versions`, turned into a warning when the user allowed other releases."""
    try:
        check_versions(tensorflow_version, keras_version)
    except UnsupportedVersionError as error:
        if not parse_flag(os.environ, ENV_ALLOW_UNSUPPORTED):
            raise
        warnings.warn(f"{error} ({ENV_ALLOW_UNSUPPORTED} is set: going on)", stacklevel=2)
