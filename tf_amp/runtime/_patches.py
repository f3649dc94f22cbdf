"""The one registry of tf_amp's patches on TensorFlow and Keras: reversible and shared.

Two switches patch upstream attributes: the environment activation
(``TF_ENABLE_AUTO_MIXED_PRECISION``) and ``enable_mixed_precision_graph_rewrite``. Both need
``Model.compile`` hooked, and they are turned on and off in any order. The rules:

* A patch is keyed by (owner object, attribute name). One replacement per key: the first
  holder to acquire a key installs it (built from the attribute's value at that moment) and
  records the original; a second holder acquiring the same key only joins it, and must ask for
  the same replacement (the replacements consult the switches' state at call time, so one
  serves both).
* A holder releases all its keys at once. A key is restored only when its last holder lets go,
  to exactly what was there before (an attribute that was inherited is deleted again, so
  lookups resolve to the base class as before). Keys are restored newest first.
* So after any interleaving of the switches, what is installed is exactly what the switches
  still on need, and with both off TensorFlow and Keras are as they were.

Standard library only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

ACTIVATION = "TF_ENABLE_AUTO_MIXED_PRECISION"
"""Holder name of the environment activation (``tf_amp.runtime.activation``)."""

ENABLE = "enable_mixed_precision_graph_rewrite"
"""Holder name of ``enable_mixed_precision_graph_rewrite`` (the Keras compile hook)."""


@dataclass
class _Patch:
    owner: Any
    name: str
    make: Callable[[Any], Any]
    original: Any
    had_own: bool  # the owner itself held the attribute (else it was inherited or absent)
    replacement: Any
    holders: set[Hashable] = field(default_factory=set)


def _own_value(owner: Any, name: str) -> tuple[bool, Any]:
    """Whether ``owner`` itself holds ``name`` (not a base class), and that value."""
    if isinstance(owner, type):
        own = vars(owner)
        return name in own, own.get(name)
    return hasattr(owner, name), getattr(owner, name, None)


class PatchRegistry:
    """Reversible, shared patches of attributes; see the module docstring for the rules."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._patches: dict[tuple[int, str], _Patch] = {}  # insertion order = install order

    def acquire(
        self, holder: Hashable, owner: Any, name: str, make: Callable[[Any], Any]
    ) -> Any:
        """Makes ``owner.name`` the patch ``make(current value)`` for ``holder``; returns it.

        Idempotent per holder. Raises ValueError when another holder installed the key with
        another ``make``: two different replacements of one attribute cannot both be right.
        """
        key = (id(owner), name)
        with self._lock:
            patch = self._patches.get(key)
            if patch is not None and holder in patch.holders:
                return patch.replacement
            if patch is None:
                had_own, original = _own_value(owner, name)
                replacement = make(getattr(owner, name))
                patch = _Patch(owner, name, make, original, had_own, replacement)
                setattr(owner, name, replacement)
                self._patches[key] = patch
            elif patch.make is not make:
                raise ValueError(
                    f"{getattr(owner, '__name__', owner)!r}.{name} is already patched by "
                    f"{sorted(map(str, patch.holders))} with another replacement"
                )
            patch.holders.add(holder)
            return patch.replacement

    def release(self, holder: Hashable) -> None:
        """Drops ``holder`` from all its keys; restores those no other holder keeps."""
        with self._lock:
            for key, patch in reversed(list(self._patches.items())):
                patch.holders.discard(holder)
                if not patch.holders:
                    self._restore(patch)
                    del self._patches[key]

    @staticmethod
    def _restore(patch: _Patch) -> None:
        if patch.had_own:
            setattr(patch.owner, patch.name, patch.original)
        else:
            with contextlib.suppress(AttributeError):
                delattr(patch.owner, patch.name)

    def count(self, holder: Hashable) -> int:
        """How many keys ``holder`` holds."""
        with self._lock:
            return sum(holder in p.holders for p in self._patches.values())

    def installed(self) -> dict[tuple[Any, str], frozenset[Hashable]]:
        """Every installed key, ``(owner, name) -> holders`` (for inspection and tests)."""
        with self._lock:
            return {(p.owner, p.name): frozenset(p.holders) for p in self._patches.values()}


REGISTRY = PatchRegistry()
"""The process's registry: every patch tf_amp makes on TensorFlow or Keras goes through it."""
