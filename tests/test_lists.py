"""Op lists and every environment override TensorFlow and NVIDIA documented, read through
RewriteConfig."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tf_amp.config import RewriteConfig
from tf_amp.lists import (
    ALLOW,
    CLEAR,
    DENY,
    ENV_PREFIX,
    INFER,
    LEVEL_ENV,
    OpLists,
    list_env_variables,
)

# (variable, list it edits): every documented spelling
LIST_VARS: list[tuple[str, str]] = [
    (ENV_PREFIX + "ALLOWLIST", ALLOW),
    (ENV_PREFIX + "INFERLIST", INFER),
    (ENV_PREFIX + "CLEARLIST", CLEAR),
    (ENV_PREFIX + "DENYLIST", DENY),
    (ENV_PREFIX + "WHITELIST", ALLOW),
    (ENV_PREFIX + "GRAYLIST", INFER),
    (ENV_PREFIX + "BLACKLIST", DENY),
    ("TF_AMP_ALLOWLIST", ALLOW),
    ("TF_AMP_INFERLIST", INFER),
    ("TF_AMP_DENYLIST", DENY),
]


def test_defaults_match_tensorflow() -> None:
    lists = OpLists.default()
    assert lists.category("MatMul") == ALLOW
    assert lists.category("Conv2DBackpropFilter") == ALLOW
    assert lists.category("AddV2") == INFER
    assert lists.category("FusedBatchNormV3") == INFER
    assert lists.category("Reshape") == CLEAR
    assert lists.category("TensorListGetItem") == CLEAR
    assert lists.category("Exp") == DENY
    assert lists.category("SparseSoftmaxCrossEntropyWithLogits") == DENY
    assert lists.category("Atan") is None
    assert len(lists.infer) == 43
    assert lists.category("DepthwiseConv2dNative") == ALLOW
    assert OpLists.default("bfloat16").category("Einsum") == ALLOW


@pytest.mark.parametrize(("var", "target"), LIST_VARS)
def test_every_add_variable(var: str, target: str) -> None:
    cfg = RewriteConfig.from_env({var + "_ADD": "Atan"})
    assert cfg.resolved_lists().category("Atan") == target


@pytest.mark.parametrize(("var", "target"), LIST_VARS)
def test_every_remove_variable(var: str, target: str) -> None:
    member = {ALLOW: "MatMul", INFER: "AddV2", CLEAR: "Reshape", DENY: "Exp"}[target]
    cfg = RewriteConfig.from_env({var + "_REMOVE": member})
    assert cfg.resolved_lists().category(member) is None


def test_all_documented_variables_are_read() -> None:
    names = set(list_env_variables())
    for var, _ in LIST_VARS:
        assert {var + "_ADD", var + "_REMOVE"} <= names


def test_add_moves_an_op_off_its_default_list() -> None:
    # TensorFlow crashes on "op in multiple lists" here; moving it is what the user means.
    lists = OpLists.from_env({ENV_PREFIX + "ALLOWLIST_ADD": "AddV2"})
    assert lists.category("AddV2") == ALLOW


def test_blanks_are_ignored() -> None:
    lists = OpLists.from_env({ENV_PREFIX + "DENYLIST_ADD": " Atan, ,,Acos ,"})
    assert lists.category("Atan") == DENY and lists.category("Acos") == DENY
    assert "" not in lists.deny


def test_op_on_two_lists_is_an_error_naming_both() -> None:
    env = {ENV_PREFIX + "ALLOWLIST_ADD": "Atan", ENV_PREFIX + "DENYLIST_ADD": "Atan"}
    with pytest.raises(ValueError, match=r"'Atan'.*allow.*deny") as error:
        OpLists.from_env(env)
    # ... and the two variables, since legacy and short aliases hide where an entry came from
    assert ENV_PREFIX + "ALLOWLIST_ADD" in str(error.value)
    assert ENV_PREFIX + "DENYLIST_ADD" in str(error.value)
    legacy = {"TF_AMP_ALLOWLIST_ADD": "Softmax", ENV_PREFIX + "BLACKLIST_ADD": "Softmax"}
    with pytest.raises(ValueError, match="TF_AMP_ALLOWLIST_ADD") as error:
        OpLists.from_env(legacy)
    assert ENV_PREFIX + "BLACKLIST_ADD" in str(error.value)
    with pytest.raises(ValueError, match=r"'MatMul' is on both the allow list and the deny"):
        OpLists(allow=frozenset({"MatMul"}), infer=frozenset(), clear=frozenset(),
                deny=frozenset({"MatMul"}))


def test_unknown_op_warns_with_closest_names(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tf_amp"):
        lists = OpLists.from_env({"TF_AMP_ALLOWLIST_ADD": "MatMull"})
    assert lists.category("MatMull") == ALLOW  # kept: a custom op may load later
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "TF_AMP_ALLOWLIST_ADD" in message and "MatMul" in message and "did you mean" in message
    caplog.clear()  # the environment is read again for every graph: said once is enough
    with caplog.at_level(logging.WARNING, logger="tf_amp"):
        OpLists.from_env({"TF_AMP_ALLOWLIST_ADD": "MatMull"})
    assert not caplog.records


@pytest.mark.parametrize(
    ("level", "check"),
    [
        ("TENSOR_CORES_ONLY", lambda ls: not (ls.infer or ls.clear or ls.deny) and ls.allow),
        ("TREAT_INFER_AS_DENY", lambda ls: not ls.infer and "AddV2" in ls.deny),
        ("UNSAFE_FORCE_ALL", lambda ls: "AddV2" in ls.infer),
        ("tensor_cores_only", lambda ls: not ls.infer),
    ],
)
def test_level_variable(level: str, check) -> None:  # noqa: ANN001
    cfg = RewriteConfig.from_env({LEVEL_ENV: level})
    assert check(cfg.resolved_lists())
    assert cfg.level == level.upper()


@pytest.mark.parametrize(
    ("var", "value"),
    [
        (LEVEL_ENV, "FAST"),
        ("TF_AMP_OPT_LEVEL", "O7"),
        ("TF_AMP_TARGET_DTYPE", "float8"),
        ("TF_AMP_ELIGIBLE_DEVICES", "tpu"),
        ("TF_AMP_CHECK_KERNELS", "maybe"),
    ],
)
def test_bad_values_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(ValueError, match=var):
        RewriteConfig.from_env({var: value})


def test_from_env_reads_everything_and_overrides_win() -> None:
    env = {
        "TF_AMP_OPT_LEVEL": "o2",
        "TF_AMP_TARGET_DTYPE": "bfloat16",
        "TF_AMP_ELIGIBLE_DEVICES": "gpu",
        "TF_AMP_EXCLUDE_SCOPES": "head, loss",
        "TF_AMP_CHECK_KERNELS": "0",
        "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH": "/tmp/x",
    }
    cfg = RewriteConfig.from_env(env)
    assert cfg.opt_level == "O2" and cfg.target_dtype == "bfloat16"
    assert cfg.eligible_devices == "gpu" and cfg.exclude_scopes == ("head", "loss")
    assert cfg.check_kernels is False and cfg.log_dir == "/tmp/x"
    assert RewriteConfig.from_env({"TF_AMP_LOG_PATH": "/tmp/y"}).log_dir == "/tmp/y"
    assert RewriteConfig.from_env(env, opt_level="O1").opt_level == "O1"


def test_plain_config_never_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PREFIX + "ALLOWLIST_REMOVE", "MatMul")
    monkeypatch.setenv("TF_AMP_OPT_LEVEL", "O3")
    cfg = RewriteConfig()
    assert cfg.opt_level == "O1" and cfg.resolved_lists().category("MatMul") == ALLOW
    assert RewriteConfig.from_env().resolved_lists().category("MatMul") is None


def test_preserve_nodes_accepts_tensor_names() -> None:
    cfg = RewriteConfig(preserve_nodes={"loss:0", "^train", "out"})
    assert cfg.preserve_nodes == frozenset({"loss", "train", "out"})


def test_config_validates_fields() -> None:
    with pytest.raises(ValueError, match="opt_level"):
        RewriteConfig(opt_level="O4")
    with pytest.raises(ValueError, match="target_dtype"):
        RewriteConfig(target_dtype="float64")
    with pytest.raises(TypeError, match="lists"):
        RewriteConfig(lists={"allow": []})  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["probe", "preserve_names", "infer_follows_allow",
                                   "check_kernels", "fold_constant_casts", "guard_updates",
                                   "guard_losses", "select_before_cast"])
def test_an_on_off_field_refuses_a_string(field: str) -> None:
    # "false", "0" and "off" are truthy: each did the opposite of what was asked, silently.
    for value in ("false", "0", "off", 0):
        with pytest.raises(TypeError, match=f"{field} must be True(, False)? or (False|None)"):
            RewriteConfig(target_dtype="float16", **{field: value})
    assert getattr(RewriteConfig(target_dtype="float16", **{field: np.bool_(False)}),
                   field) is False


def test_log_dir_and_level_refuse_what_is_not_a_path_or_a_name(tmp_path) -> None:
    with pytest.raises(TypeError, match="log_dir must be a path"):
        RewriteConfig(log_dir=123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="level must be a string"):
        RewriteConfig(level=None)  # type: ignore[arg-type]
    assert RewriteConfig(log_dir=tmp_path).log_dir == str(tmp_path)


def test_a_config_replaced_to_another_target_takes_that_targets_lists() -> None:
    # from_env froze the lists of the target it resolved: a bfloat16 rewrite ran with the
    # float16 lists (Mean and Sum on deny, where TensorFlow's oneDNN lists have them infer).
    env = {"TF_AMP_TARGET_DTYPE": "float16", ENV_PREFIX + "DENYLIST_ADD": "Atan"}
    replaced = RewriteConfig.from_env(env).replace(target_dtype="bfloat16").resolved_lists()
    direct = OpLists.default("bfloat16")
    assert replaced.category("Mean") == direct.category("Mean") == INFER
    assert replaced.category("Atan") == DENY  # the environment's edits still apply
    assert replaced.with_edits([(DENY, "REMOVE", "Atan")]) == direct


def test_tensor_cores_only_leaves_the_bfloat16_lists_as_tensorflows_onednn_pass_does() -> None:
    bf16 = RewriteConfig(target_dtype="bfloat16", level="TENSOR_CORES_ONLY").resolved_lists()
    assert bf16 == OpLists.default("bfloat16")
    fp16 = RewriteConfig(target_dtype="float16", level="TENSOR_CORES_ONLY").resolved_lists()
    assert fp16.infer == fp16.clear == fp16.deny == frozenset()


def test_tensor_cores_only_drops_the_edits_of_the_lists_it_empties_as_tensorflow_does() -> None:
    """TensorFlow empties the infer, clear and deny lists before their edits: with
    DENYLIST_ADD=MatMul its GPU pass still converts MatMul, which the move-off-the-allow-list
    rule had left on no list at all (float32)."""
    env = {"TF_AMP_TARGET_DTYPE": "float16", ENV_PREFIX + "LEVEL": "TENSOR_CORES_ONLY",
           ENV_PREFIX + "DENYLIST_ADD": "MatMul", ENV_PREFIX + "ALLOWLIST_ADD": "Relu"}
    lists = RewriteConfig.from_env(env).resolved_lists()
    assert lists.category("MatMul") == lists.category("Relu") == ALLOW
    assert lists.deny == frozenset()
    assert OpLists.from_env(env, target_dtype="float16") == lists


@pytest.mark.parametrize("field", ["preserve_nodes", "exclude_scopes", "slow_nodes"])
def test_a_names_field_refuses_one_bare_string(field: str) -> None:
    """A string would be read as its letters and protect nothing, silently."""
    with pytest.raises(TypeError, match=rf"{field} must be a collection of names.*\('Identity',\)"):
        RewriteConfig(**{field: "Identity"})
    with pytest.raises(TypeError, match=f"{field} must be a collection of names"):
        RewriteConfig(**{field: [1]})
    assert set(getattr(RewriteConfig(**{field: (n for n in ["Identity"])}), field)) == {"Identity"}


# Each list is edited on its own, as TensorFlow's UpdateList does: an ADD then a REMOVE of one
# op from one list cancel (the op stays on its default list), and the legacy name comes after
# the modern one. Checked against TensorFlow's own pass on a graph where Mul's list shows.
_EDIT_CASES = {
    "add then remove": ({"ALLOWLIST_ADD": "Mul", "ALLOWLIST_REMOVE": "Mul"}, INFER),
    "legacy remove after modern add": ({"ALLOWLIST_ADD": "Mul", "WHITELIST_REMOVE": "Mul"},
                                       INFER),
    "removed from its own list": ({"INFERLIST_ADD": "Mul", "INFERLIST_REMOVE": "Mul"}, None),
}


def test_an_add_after_a_remove_moves_the_op_where_tensorflow_refuses_the_graph() -> None:
    # TensorFlow leaves Mul on its default infer list too and fails the pass ("Op present in
    # multiple lists"); the ADD moving it is what the user means.
    lists = OpLists.from_env({ENV_PREFIX + "ALLOWLIST_REMOVE": "Mul",
                              ENV_PREFIX + "WHITELIST_ADD": "Mul"})
    assert lists.category("Mul") == ALLOW


@pytest.mark.parametrize("case", list(_EDIT_CASES))
def test_list_edits_follow_tensorflows_update_list(case: str, monkeypatch) -> None:
    import tensorflow as tf

    from tests._oracle import run_tf_pass
    from tf_amp.rewriter import rewrite_graph_def

    edits, category = _EDIT_CASES[case]
    for name, value in edits.items():
        monkeypatch.setenv(ENV_PREFIX + name, value)
    assert OpLists.from_env().category("Mul") == category

    @tf.function
    def f(x, w):
        # mul lies between two MatMuls (half on allow or infer); mul_1 reads a feed and feeds
        # a deny op (half on allow only).
        return tf.matmul(tf.matmul(x, w) * 3.0, w), tf.reduce_sum(x * 3.0)

    graph_def = f.get_concrete_function(
        tf.TensorSpec([4, 8]), tf.TensorSpec([8, 8])).graph.as_graph_def()
    fetches = ["Identity", "Identity_1"]
    ours = rewrite_graph_def(graph_def, RewriteConfig.from_env(
        target_dtype="float16", preserve_nodes=frozenset(fetches))).report
    theirs, _ = run_tf_pass(graph_def, fetches)
    tf_dtypes = {n.name: tf.as_dtype(n.attr["T"].type).name for n in theirs.node
                 if n.op == "Mul"}
    assert {m: ours.decision_for(m).dtype for m in ("mul", "mul_1")} == tf_dtypes
