"""Startup hook body: imported by ``tf_amp_autoenable.pth`` only when a variable is set.

The ``.pth`` line tests the environment itself (``os`` is already imported at startup), so a
process without ``TF_ENABLE_AUTO_MIXED_PRECISION*`` imports nothing from tf_amp. When a variable
is set, this module registers the activation; TensorFlow and Keras are patched right after the
script imports them (:mod:`tf_amp.runtime.activation`), so startup itself stays cheap.

A value that cannot be parsed must not be ignored silently (the failure mode this package
exists to fix), and must not break every Python process in the environment either: the error
is raised by the script's ``import tensorflow``, naming the variable.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

from tf_amp.runtime import activation


class _RaiseOnImport(importlib.abc.MetaPathFinder):
    """Makes ``import tensorflow`` / ``import keras`` fail with the configuration error."""

    def __init__(self, error: ValueError) -> None:
        self.error = error

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in ("tensorflow", "keras"):
            raise ValueError(f"tf_amp: {self.error}")
        return None


def _main() -> None:
    try:
        activation.activate_from_env()
    except ValueError as error:
        sys.meta_path.insert(0, _RaiseOnImport(error))


_main()
