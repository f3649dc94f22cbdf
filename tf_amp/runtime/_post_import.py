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
    ``exec_module``; while it is not on ``sys.meta_path`` it does nothing.

    ``defer_inside`` (a package prefix such as ``"tf_amp."``): a callback due while a module
    of that package is still being imported waits until that import is over. The callbacks
    import such modules themselves; one that imports TensorFlow first (``import tf_amp.ops``
    as a script's first line) would otherwise run them while it is half made, and they would
    fail on a name it has not defined yet.
    """

    def __init__(
        self, callbacks: dict[str, Callable[[Any], None]], defer_inside: str | None = None
    ) -> None:
        self._callbacks = callbacks
        self._defer_inside = defer_inside
        self._busy: set[str] = set()
        self._importing = 0  # imports under ``defer_inside`` in progress
        self._deferred: list[Callable[[], None]] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        callback = self._callbacks.get(fullname)
        tracked = self._defer_inside is not None and fullname.startswith(self._defer_inside)
        if (callback is None and not tracked) or fullname in self._busy:
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
            self._importing += tracked
            try:
                loader_exec(module)
                if callback is not None and self in sys.meta_path:  # still active
                    self._deferred.append(lambda: callback(module))
            finally:
                self._importing -= tracked
                if self._importing == 0:
                    self._run_deferred()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def _run_deferred(self) -> None:
        while self._deferred:
            self._deferred.pop(0)()

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
