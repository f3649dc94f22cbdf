"""Every environment variable that edits the lists, read here and nowhere else.

The ``..._ADD`` / ``..._REMOVE`` variables for the new names, the legacy WHITELIST / GRAYLIST /
BLACKLIST aliases, NVIDIA's ``TF_AMP_*`` short forms, and the ``..._LEVEL`` switch. Op names
TensorFlow has not registered are kept (custom ops may be loaded later) but warned about with
the closest registered names, because a typo here otherwise fails silently.
"""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Mapping

from tf_amp._say_once import mark_said
from tf_amp.lists.names import ALLOW, CLEAR, DENY, INFER

logger = logging.getLogger("tf_amp")

ENV_PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"
LEVEL_ENV = ENV_PREFIX + "LEVEL"
LEVELS: tuple[str, ...] = ("", "TENSOR_CORES_ONLY", "TREAT_INFER_AS_DENY", "UNSAFE_FORCE_ALL")

# (environment variable stem, list it edits), in the order the edits apply. TensorFlow's
# ``UpdateList`` edits each list with its modern name, then its legacy name (so a legacy REMOVE
# undoes a modern ADD); tf_amp's own short names come last, so they have the final word.
_ENV_STEMS: tuple[tuple[str, str], ...] = (
    (ENV_PREFIX + "ALLOWLIST", ALLOW),
    (ENV_PREFIX + "INFERLIST", INFER),
    (ENV_PREFIX + "CLEARLIST", CLEAR),
    (ENV_PREFIX + "DENYLIST", DENY),
    (ENV_PREFIX + "WHITELIST", ALLOW),
    (ENV_PREFIX + "GRAYLIST", INFER),
    (ENV_PREFIX + "BLACKLIST", DENY),
    ("TF_AMP_ALLOWLIST", ALLOW),
    ("TF_AMP_INFERLIST", INFER),
    ("TF_AMP_CLEARLIST", CLEAR),
    ("TF_AMP_DENYLIST", DENY),
)


def list_env_variables() -> tuple[str, ...]:
    """Every environment variable that edits a list (for docs, tests and error messages)."""
    return tuple(f"{stem}_{verb}" for stem, _ in _ENV_STEMS for verb in ("ADD", "REMOVE"))


@functools.lru_cache(maxsize=1)
def registered_op_names() -> frozenset[str]:
    """All op names in TensorFlow's registry (cached: the registry only grows by loading
    libraries, and a stale cache can only produce a spurious warning)."""
    from tensorflow.core.framework import op_def_pb2

    from tf_amp._upstream.tensorflow import pywrap_tf_session as c_api

    buf = c_api.TF_GetAllOpList()
    try:
        op_list = op_def_pb2.OpList()
        op_list.ParseFromString(c_api.TF_GetBuffer(buf))
    finally:
        c_api.TF_DeleteBuffer(buf)
    return frozenset(op.name for op in op_list.op)


def split_op_names(value: str) -> list[str]:
    """Split a comma-separated env value; blanks (``"A,,B, "``) are ignored, as users expect."""
    return [part.strip() for part in value.split(",") if part.strip()]


def list_edits_from_env(env: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
    """``(list name, "ADD"|"REMOVE", op, variable)`` for every op named by a list variable set
    in ``env``, in the order ``OpLists.with_edits`` applies them."""
    edits: list[tuple[str, str, str, str]] = []
    for stem, list_name in _ENV_STEMS:
        for verb in ("ADD", "REMOVE"):
            var = f"{stem}_{verb}"
            for op in split_op_names(env.get(var, "")):
                _warn_if_unknown(op, var)
                edits.append((list_name, verb, op, var))
    return edits


def level_from_env(env: Mapping[str, str]) -> str:
    """The ``..._LEVEL`` value as written (stripped); raises ValueError naming the choices."""
    level = env.get(LEVEL_ENV, "").strip()
    if level.upper() not in LEVELS:
        raise ValueError(f"{LEVEL_ENV} must be one of {LEVELS[1:]} or empty, got {level!r}")
    return level


def _warn_if_unknown(op: str, variable: str) -> None:
    """Warns once per process for each (variable, op): the environment is read again for
    every graph rewritten, and the same mistyped name said five times is noise."""
    names = registered_op_names()
    if op in names or not mark_said(("unregistered op in a list variable", variable, op)):
        return
    close = difflib.get_close_matches(op, sorted(names), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    logger.warning("%s names op %r, which TensorFlow has not registered%s", variable, op, hint)
