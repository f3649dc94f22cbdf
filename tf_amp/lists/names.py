"""The names of the four op lists, as config, environment variables and reports spell them."""

from __future__ import annotations

ALLOW = "allow"
INFER = "infer"
CLEAR = "clear"
DENY = "deny"
LIST_NAMES: tuple[str, ...] = (ALLOW, INFER, CLEAR, DENY)
