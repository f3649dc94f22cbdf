"""The painter's two per-vertex bytes: its colour, and the op list its op is on.

Colours: ``NONE`` (float32 unless a pass paints it), ``ALLOW_C`` (becomes the 16-bit target),
``DENY_C`` (must stay float32, and stops allow from spreading). Categories are the op lists
(``tf_amp.lists``) as small ints, so the passes compare bytes, not strings.
"""

from __future__ import annotations

from tf_amp.lists import ALLOW, CLEAR, DENY, INFER

# colours
NONE, ALLOW_C, DENY_C = 0, 1, 2
# list categories (bytes)
CAT_NONE, CAT_ALLOW, CAT_INFER, CAT_CLEAR, CAT_DENY = 0, 1, 2, 3, 4
CATEGORY_OF_LIST: dict[str, int] = {
    ALLOW: CAT_ALLOW,
    INFER: CAT_INFER,
    CLEAR: CAT_CLEAR,
    DENY: CAT_DENY,
}
