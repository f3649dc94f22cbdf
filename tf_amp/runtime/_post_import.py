"""Run a callback right after a module finishes importing.

Why: the environment activation starts at interpreter start-up, before the script imports
TensorFlow, and must not import it itself (that would cost every Python process seconds). It
patches TensorFlow and Keras the moment the script's own import of them completes.
Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any


class PostImportHook(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that wraps the named modules' loaders to call back after
    ``exec_module``; while it is not on ``sys.meta_path`` it does nothing."""

    def __init__(self, callbacks: dict[str, Callable[[Any], None]]) -> None:
        self._callbacks = callbacks
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        callback = self._callbacks.get(fullname)
        if callback is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            loader_exec(module)
            if self in sys.meta_path:  # still active
                callback(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
