"""The four op lists (allow / infer / clear / deny) as data, with environment overrides.

Why lists: a mixed-precision rewrite has to know, per op type, whether running it in half
precision is *worth it* (allow: tensor-core matmuls and convolutions), *safe unless fed by
something dangerous* (infer: elementwise arithmetic), *numerically irrelevant* (clear: data
movement), or *dangerous* (deny: exponentials and large reductions). The defaults mirror
TensorFlow's own pass (``auto_mixed_precision_lists.h``) so that models behave the same under
tf_amp as under the NVIDIA container.

Every environment override TensorFlow and NVIDIA ever documented is honoured here, and only
here (``OpLists.from_env``): the ``..._ADD`` / ``..._REMOVE`` variables for the new names, the
legacy WHITELIST / GRAYLIST / BLACKLIST aliases and NVIDIA's ``TF_AMP_*`` short forms.

Modules: ``names`` (the four lists' names), ``float16`` and ``bfloat16`` (the default lists, as
data), ``environment`` (every variable that edits them), ``op_lists`` (``OpLists``).
"""

from __future__ import annotations

from tf_amp.lists.bfloat16 import BF16_ALLOW, BF16_CLEAR, BF16_DENY, BF16_INFER
from tf_amp.lists.environment import (
    ENV_PREFIX,
    LEVEL_ENV,
    LEVELS,
    list_edits_from_env,
    list_env_variables,
    registered_op_names,
    split_op_names,
)
from tf_amp.lists.float16 import FP16_ALLOW, FP16_CLEAR, FP16_DENY, FP16_INFER
from tf_amp.lists.names import ALLOW, CLEAR, DENY, INFER, LIST_NAMES
from tf_amp.lists.op_lists import OpLists

__all__ = [
    "ALLOW",
    "BF16_ALLOW",
    "BF16_CLEAR",
    "BF16_DENY",
    "BF16_INFER",
    "CLEAR",
    "DENY",
    "ENV_PREFIX",
    "FP16_ALLOW",
    "FP16_CLEAR",
    "FP16_DENY",
    "FP16_INFER",
    "INFER",
    "LEVELS",
    "LEVEL_ENV",
    "LIST_NAMES",
    "OpLists",
    "list_edits_from_env",
    "list_env_variables",
    "registered_op_names",
    "split_op_names",
]
