"""``OpLists``: the four disjoint sets of op types, their defaults, and their edits."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tf_amp.lists.bfloat16 import BF16_ALLOW, BF16_CLEAR, BF16_DENY, BF16_INFER
from tf_amp.lists.environment import (
    ENV_PREFIX,
    LEVEL_ENV,
    LEVELS,
    level_from_env,
    list_edits_from_env,
)
from tf_amp.lists.float16 import FP16_ALLOW, FP16_CLEAR, FP16_DENY, FP16_INFER
from tf_amp.lists.names import ALLOW, LIST_NAMES


@dataclass(frozen=True)
class OpLists:
    """Four disjoint sets of op type names. Construct with ``OpLists.default()`` or
    ``OpLists.from_env()``; direct construction validates disjointness.

    >>> lists = OpLists.default()
    >>> lists.category("MatMul")
    'allow'
    """

    allow: frozenset[str]
    infer: frozenset[str]
    clear: frozenset[str]
    deny: frozenset[str]

    def __post_init__(self) -> None:
        for name in LIST_NAMES:
            object.__setattr__(self, name, frozenset(getattr(self, name)))
        seen: dict[str, str] = {}
        for name in LIST_NAMES:
            for op in sorted(getattr(self, name)):
                if op in seen:
                    raise ValueError(
                        f"Op {op!r} is on both the {seen[op]} list and the {name} list; an op "
                        f"must be on at most one list (remove it from one of them, e.g. with "
                        f"{ENV_PREFIX}{seen[op].upper()}LIST_REMOVE={op})."
                    )
                seen[op] = name
        object.__setattr__(self, "_category", seen)

    def category(self, op: str) -> str | None:
        """The list ``op`` is on, or None (ops on no list stay float32)."""
        return self._category.get(op)  # type: ignore[attr-defined]

    def as_dict(self) -> dict[str, list[str]]:
        """Sorted plain data, for logs and JSON."""
        return {name: sorted(getattr(self, name)) for name in LIST_NAMES}

    @classmethod
    def default(cls, target_dtype: str = "float16") -> OpLists:
        """TensorFlow's default lists for ``target_dtype`` ("float16" or "bfloat16")."""
        if target_dtype not in ("float16", "bfloat16"):
            raise ValueError(f"target_dtype must be 'float16' or 'bfloat16', got {target_dtype!r}")
        if target_dtype == "float16":
            return cls(allow=FP16_ALLOW, infer=FP16_INFER, clear=FP16_CLEAR, deny=FP16_DENY)
        return cls(allow=BF16_ALLOW, infer=BF16_INFER, clear=BF16_CLEAR, deny=BF16_DENY)

    def with_level(self, level: str, target_dtype: str = "float16") -> OpLists:
        """Apply TensorFlow's ``..._LEVEL``: TENSOR_CORES_ONLY keeps only the allow list of
        the float16 lists (TensorFlow's oneDNN bfloat16 lists never read it);
        TREAT_INFER_AS_DENY moves infer ops to deny; UNSAFE_FORCE_ALL is handled by the
        painter (it paints everything) and leaves the lists alone."""
        level = level.upper()
        if level not in LEVELS:
            raise ValueError(f"{LEVEL_ENV} must be one of {LEVELS[1:]} or empty, got {level!r}")
        if level == "TENSOR_CORES_ONLY" and target_dtype != "bfloat16":
            return OpLists(self.allow, frozenset(), frozenset(), frozenset())
        if level == "TREAT_INFER_AS_DENY":
            return OpLists(self.allow, frozenset(), self.clear, self.deny | self.infer)
        return self

    def edited_at_level(
        self, edits: Iterable[tuple[str, ...]], level: str, target_dtype: str = "float16"
    ) -> OpLists:
        """``with_edits`` then ``with_level``, as TensorFlow orders them: under
        TENSOR_CORES_ONLY (float16 lists) its infer, clear and deny lists are empty before any
        edit, so only the allow list's edits count (a ``DENYLIST_ADD=MatMul`` there left
        MatMul on no list, where TensorFlow converts it)."""
        if level.upper() == "TENSOR_CORES_ONLY" and target_dtype != "bfloat16":
            edits = [edit for edit in edits if edit[0] == ALLOW]
        return self.with_edits(edits).with_level(level, target_dtype)

    def with_edits(self, edits: Iterable[tuple[str, ...]]) -> OpLists:
        """Apply ``(list_name, "ADD"|"REMOVE", op[, source])`` edits, as TensorFlow's
        ``UpdateList`` does: each list is edited on its own, in order (so an ADD and a later
        REMOVE of one op from one list cancel, and the op stays on its default list).

        Then an op that an ADD left on a list moves off the other lists (so
        ``ALLOWLIST_ADD=Mul`` just works, where TensorFlow would crash on "op in multiple
        lists"); an op left added to two lists is the user's contradiction and an error,
        which names the two ``source``s (the environment variables) when given.
        """
        sets = {name: set(getattr(self, name)) for name in LIST_NAMES}
        added: dict[str, dict[str, str]] = {}  # op -> {list it was added to: " (source)"}
        for list_name, verb, op, *source in edits:
            if verb == "ADD":
                sets[list_name].add(op)
                added.setdefault(op, {})[list_name] = f" ({source[0]})" if source else ""
            else:
                sets[list_name].discard(op)
                added.get(op, {}).pop(list_name, None)
        for op, lists in added.items():
            if len(lists) > 1:
                (first, first_where), (second, second_where) = list(lists.items())[:2]
                raise ValueError(
                    f"Op {op!r} is added to both the {first} list{first_where} and the "
                    f"{second} list{second_where}; choose one."
                )
            for list_name in lists:
                for other in LIST_NAMES:
                    if other != list_name:
                        sets[other].discard(op)
        return OpLists(**{name: frozenset(values) for name, values in sets.items()})

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        target_dtype: str = "float16",
        base: OpLists | None = None,
    ) -> OpLists:
        """Defaults (or ``base``) edited by every list variable set in ``environ``.

        Names that TensorFlow has no op for are kept (custom ops may be loaded later) but
        warned about with the closest registered names, because a typo here otherwise fails
        silently.
        """
        env = os.environ if environ is None else environ
        lists = base if base is not None else cls.default(target_dtype)
        return lists.edited_at_level(list_edits_from_env(env), level_from_env(env), target_dtype)
