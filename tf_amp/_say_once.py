"""Log lines said once per process.

Why one place: much of what tf_amp logs is said while a graph is rewritten, and one run
rewrites many graphs (every trace of a ``tf.function``, every import of new nodes into a
``tf_amp.Session``, every read of the environment's list variables), each time with the same
thing to say. Each such line is said under a key; the first time only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from typing import Any

_LOG = logging.getLogger("tf_amp")
_SAID: set[Hashable] = set()
_LOCK = threading.Lock()


def mark_said(key: Hashable) -> bool:
    """Records ``key`` as said; True when it was not yet (the caller says it now)."""
    with _LOCK:
        if key in _SAID:
            return False
        _SAID.add(key)
        return True


def say_once(key: Hashable, level: int, message: str, *args: Any, **kwargs: Any) -> None:
    """Logs ``message % args`` on the ``tf_amp`` logger the first time ``key`` comes."""
    if mark_said(key):
        _LOG.log(level, message, *args, **kwargs)
