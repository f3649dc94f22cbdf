"""On/off environment flags, parsed one way everywhere (rewrite config and activation).

Standard library only: the startup hook imports it at interpreter start whenever a
``TF_ENABLE_AUTO_MIXED_PRECISION*`` variable is set, even to 0, before anything else of tf_amp
is needed.
"""

from __future__ import annotations

from collections.abc import Mapping

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def parse_flag(environ: Mapping[str, str], name: str) -> bool | None:
    """``None`` when unset or empty; True/False for the accepted spellings; else ValueError."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{name}={raw!r} is not understood; use 1 (on) or 0 (off) "
        "(also accepted: true/false, yes/no, on/off)"
    )


def parse_choice(
    environ: Mapping[str, str], name: str, choices: tuple[str, ...], default: str,
    upper: bool = False,
) -> str:
    """The value of ``name`` (upper- or lower-cased) if one of ``choices``; ``default`` when
    unset or empty; else ValueError naming the variable and the choices."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    value = raw.upper() if upper else raw.lower()
    if value not in choices:
        shown = [c for c in choices if c]
        raise ValueError(f"{name}={raw!r} is not understood; use one of {shown}")
    return value


def flag_or(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """``parse_flag``, with ``default`` when the variable is unset or empty."""
    value = parse_flag(environ, name)
    return default if value is None else value
