"""RewriteConfig: every knob of the graph rewrite, and the one place that reads its env vars.

Why one place: the rewrite itself is a pure function of (GraphDef, RewriteConfig). Reading the
environment inside the passes would make results depend on hidden global state (and make the
rewrite "stay on" after a test set a variable). ``RewriteConfig()`` never looks at the
environment; ``RewriteConfig.from_env()`` does, once, and validates every value.

Environment variables read by ``from_env``:

- list edits: ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_{ALLOWLIST,INFERLIST,CLEARLIST,DENYLIST}_
  {ADD,REMOVE}``, legacy ``..._{WHITELIST,GRAYLIST,BLACKLIST}_{ADD,REMOVE}``, and
  ``TF_AMP_{ALLOWLIST,INFERLIST,CLEARLIST,DENYLIST}_{ADD,REMOVE}`` (see ``tf_amp.lists``);
- ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL``: TENSOR_CORES_ONLY | TREAT_INFER_AS_DENY |
  UNSAFE_FORCE_ALL;
- ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH`` or ``TF_AMP_LOG_PATH``: log directory;
- ``TF_AMP_OPT_LEVEL``: O0 | O1 | O2 | O3;
- ``TF_AMP_TARGET_DTYPE``: auto (the default here) | float16 | bfloat16 (see ``tf_amp.hardware``);
- ``TF_AMP_ELIGIBLE_DEVICES``: all | gpu;
- ``TF_AMP_EXCLUDE_SCOPES``: comma-separated name scopes kept in float32;
- ``TF_AMP_INFER_FOLLOWS_ALLOW``: 1 (default) | 0 (TensorFlow's pass 4 off; see the field);
- ``TF_AMP_PROBE``: 1 | 0 (time the allow/infer ops at their shapes first: ``tf_amp.probe``);
- ``TF_AMP_GUARD_NORMALIZATION``, ``TF_AMP_GUARD_UPDATES``, ``TF_AMP_GUARD_LOSSES``,
  ``TF_AMP_GUARD_ACCUMULATORS``: 1 | 0 (unset: the target's default; see the fields);
- ``TF_AMP_SELECT_BEFORE_CAST``: 1 (default) | 0 (see the field);
- ``TF_AMP_CHECK_KERNELS``: 1 | 0 (0 = trust the OpDef, for GPU-targeted rewriting on a
  machine whose TensorFlow has no GPU kernels).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from tf_amp import hardware
from tf_amp._flags import flag_or, parse_choice, parse_flag
from tf_amp._say_once import mark_said, say_once
from tf_amp.lists import (
    LEVEL_ENV,
    LEVELS,
    LIST_NAMES,
    OpLists,
    list_edits_from_env,
    split_op_names,
)

OPT_LEVELS: tuple[str, ...] = ("O0", "O1", "O2", "O3")
TARGET_DTYPES: tuple[str, ...] = ("auto", "float16", "bfloat16")
# What a config's target_dtype holds once "auto" is resolved: "float32" = no fast reduced
# precision on this hardware, so the graph is left unchanged.
RESOLVED_TARGETS: tuple[str, ...] = ("float16", "bfloat16", "float32")
ELIGIBLE_DEVICES: tuple[str, ...] = ("all", "gpu")
LOG_PATH_ENVS: tuple[str, ...] = (
    "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH",
    "TF_AMP_LOG_PATH",
)


@functools.lru_cache(maxsize=1)
def local_device_type() -> str:
    """"GPU" when this process's TensorFlow sees a GPU, else "CPU" (asked once)."""
    import tensorflow as tf

    return "GPU" if tf.config.list_physical_devices("GPU") else "CPU"




def process_target(announce: bool = True) -> hardware.TargetChoice:
    """The target this process's environment resolves to (``RewriteConfig.from_env()``), said
    once per process in plain words: the dtype, whether loss scaling comes with it, and why.
    What ``enable_mixed_precision_graph_rewrite`` and the environment activation decide by."""
    config = RewriteConfig.from_env()
    choice = hardware.TargetChoice(config.target_dtype, config.target_reason)
    if announce:
        announce_target(choice)
    return choice


def announce_target(choice: hardware.TargetChoice) -> None:
    """Says ``choice`` in the log, once per process per choice: the dtype, whether loss
    scaling comes with it, and why."""
    scaling = "with" if choice.needs_loss_scaling else "without"
    say_once(
        ("target", choice),
        logging.INFO,
        "target %s, %s loss scaling: %s",
        choice.dtype,
        scaling,
        choice.reason,
    )


def mark_target_announced(choice: hardware.TargetChoice) -> None:
    """Records that ``choice`` and its reason were said in the log by another line (the
    environment activation's), so :func:`process_target` does not say them a second time."""
    mark_said(("target", choice))


@dataclass(frozen=True)
class RewriteConfig:
    """What to rewrite and how.

    Attributes:
      target_dtype: "float16" (the default of this explicit, pure constructor), "bfloat16",
        "float32" (leaves the graph unchanged), or "auto": the fastest reduced precision for
        the device the graph runs on
        (``tf_amp.hardware.choose_target``: float16 on a CUDA GPU, bfloat16 on a CPU with
        AMX-BF16 / AVX512-BF16, else "float32", which leaves the graph unchanged). Resolved
        at construction, so the field always holds the dtype used; ``from_env`` (what every
        way in uses) defaults to "auto".
      target_reason: why ``target_dtype`` was chosen, in words (set when resolved; shown in
        the report and the activation log).
      eligible_devices: "all" treats every node as a candidate (the CPU default, and what the
        tests use); "gpu" only nodes placed on a GPU, like TensorFlow's own pass.
      preserve_nodes: node names never changed (feeds and fetches): their dtypes stay.
      preserve_names: name-preserving mode: an op that becomes half moves to a new name and a
        Cast back to float takes its original name, so every original tensor name keeps its
        dtype (what a TF1 Session adapter needs to map feeds and fetches by name).
      opt_level: "O0" unchanged, "O1" list based (TensorFlow's behaviour), "O2" every float op
        with a half kernel except deny-list ops, "O3" every op with a half kernel.
      lists: the op lists; None means ``OpLists.default(target_dtype)``, the target's own.
      list_edits: ``(list, "ADD"|"REMOVE", op[, source])`` edits applied on top of ``lists``
        (``OpLists.with_edits``): what ``from_env`` reads from the list variables. Kept as
        edits, not baked into ``lists``, so a config ``replace``d to another target edits that
        target's defaults.
      level: TensorFlow's ``..._LEVEL`` (TENSOR_CORES_ONLY, TREAT_INFER_AS_DENY,
        UNSAFE_FORCE_ALL), applied on top of ``lists``. TENSOR_CORES_ONLY empties the float16
        lists only: TensorFlow's oneDNN bfloat16 lists never read it.
      log_dir: where to write before/after graphs and the decision report (a path); None:
        nowhere.
      exclude_scopes: name scopes (node-name prefixes) kept float32, like an ``_tf_amp_exclude``
        attr on each of their nodes.
      check_kernels: require a registered half kernel for the node's device type. Turn off to
        rewrite for a GPU on a machine whose TensorFlow only has CPU kernels (the OpDef's
        allowed types are still checked).
      default_device_type: device type assumed for nodes with no device: "CPU", "GPU", or
        "auto" (the default): "GPU" when TensorFlow sees a GPU, since the placer will put
        unplaced nodes there, else "CPU". Traced ``tf.function`` graphs leave devices unset,
        so on a GPU machine this decides which half kernels (GPU's: CudnnRNN, BlockLSTM...)
        count.
      rewrite_functions: also rewrite every FunctionDef in the graph's library.
      fold_constant_casts: a float32 Const read only by half consumers becomes a half Const
        in place instead of feeding a Cast (not in name-preserving mode, never for preserved
        nodes). Measured (bench/rewrite_speed.py --const-fold, frozen 4-conv CNN): GraphDef
        49% smaller, no Cast nodes, step time equal within noise (Grappler would fold the
        Cast at run time anyway), rewrite +1 ms. It wins, so it is the default.
      probe: before painting, time every allow / infer op of the main graph at its own
        shapes in float32 and in the target on this machine (``tf_amp.probe``) and keep
        float32 the allow ops that are not faster and the infer ops 1.5x slower, when they
        also lose 20 us per run (``tf_amp.probe.MIN_LOSS_S``: below it, noise). Costs
        seconds per rewrite; worth it where the reduced kernels' speed is not known (a new
        CPU, float16 on a CPU).
      slow_nodes: main-graph node names kept float32 because they were measured slower in
        the target (what ``probe`` finds; may also be given directly).
      infer_follows_allow: run TensorFlow's pass AddInferToAllowIfFollowAllow (an infer op
        fed directly by a half op, and by no deny op, turns half; e.g. the BiasAdd after a
        Conv2D). On by default because TensorFlow 2.21 runs it in every mode, its CUDA GPU
        pass included: verified with the CUDA build on a virtual GPU (its log says "Beginning
        pass 4 to add infer list ops to allow if they directly follow allow nodes"; see
        tests/_gpu_oracle.py and tests/test_differential_gpu.py), so the default paints like
        TensorFlow's GPU pass. ``False`` is kept as an option: fewer ops in half (on the LSTM/GRU
        test graph also fewer Casts), so less of the model on the Tensor Cores.
      guard_normalization: keep the two nodes of a batch/layer normalization whose half
        rounding cancels, ``x * inv`` and ``x * inv + (offset - mean * inv)``, in float32
        (``tf_amp.painter.normalization_guard`` says why and what was measured); never at O3
        or ``UNSAFE_FORCE_ALL``, which ask for every op. None (the default) means: for
        float16, where it was measured
        (closer to float32, and fewer Casts than TensorFlow's GPU pass on every test graph);
        not for bfloat16, whose reference is TensorFlow's oneDNN pass and where the guard
        adds Casts (keras_cnn: 15 to float32 against TensorFlow's 12) at a speed not yet
        measured on a CPU with AMX.
      guard_updates: keep float32 the arithmetic whose results serve only variable updates
        (an optimizer step, moving statistics; ``tf_amp.painter.update_guard`` says why),
        as float32 master weights mean; never at O3 or ``UNSAFE_FORCE_ALL``. None (the
        default): for bfloat16,
        where it was measured faster on a CPU (bfloat16 elementwise kernels are slower there
        than float32's, and each painted update cast its float32 state to bfloat16); not for
        float16, whose default is TensorFlow's GPU pass (its loss-scaled Keras steps unscale
        into float32 before the optimizer anyway).
      guard_losses: keep a Keras model's loss (Keras 3's compiled loss, tf_keras's ``Loss``
        objects) and its gradient float32, as Keras's mixed policies compute losses
        (``tf_amp.painter.loss_guard``: a clip bound of ``1 - 1e-7`` is 1.0 in 16 bits, and
        ``binary_crossentropy`` on probabilities went NaN); never at O3 or
        ``UNSAFE_FORCE_ALL``. None (the default):
        on for both targets; ``False`` paints the loss as TensorFlow's pass does.
      guard_accumulators: keep float32 a loop's running sum (``acc = acc + x`` in a
        ``tf.while_loop`` body or a TF1 loop, and the gradient loop's sums of a weight's
        gradient over the iterations), whose half rounding loses every addend below half a
        unit of the sum (``tf_amp.painter.accumulator_guard``); never at O3 or
        ``UNSAFE_FORCE_ALL``. None (the default): on for both targets; it adds no Cast (the
        loop variable is float32 either way). ``False`` paints as TensorFlow's pass does.
      select_before_cast: keep float32 the gathers and slices of a float32 weight table
        that only they read (an embedding lookup), so the Cast is of the rows they select,
        not of the whole table every step (``tf_amp.painter.table_selection``). Same bits
        either way, since a cast commutes with a selection; Keras's Embedding does the same.
        On for every target; never at O3 or ``UNSAFE_FORCE_ALL``, which asks for every op.
    """

    target_dtype: str = "float16"
    target_reason: str = ""
    eligible_devices: str = "all"
    preserve_nodes: frozenset[str] = field(default_factory=frozenset)
    preserve_names: bool = False
    opt_level: str = "O1"
    lists: OpLists | None = None
    list_edits: tuple[tuple[str, ...], ...] = ()
    level: str = ""
    log_dir: str | None = None
    exclude_scopes: tuple[str, ...] = ()
    check_kernels: bool = True
    default_device_type: str = "auto"
    rewrite_functions: bool = True
    fold_constant_casts: bool = True
    infer_follows_allow: bool = True
    probe: bool = False
    guard_normalization: bool | None = None
    guard_updates: bool | None = None
    guard_losses: bool | None = None
    guard_accumulators: bool | None = None
    select_before_cast: bool = True
    slow_nodes: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        # Accept tensor names too ("loss:0", "^train"): preservation is per node.
        nodes = frozenset(
            n.lstrip("^").split(":")[0] for n in _names("preserve_nodes", self.preserve_nodes)
        )
        object.__setattr__(self, "preserve_nodes", nodes)
        object.__setattr__(self, "exclude_scopes", _names("exclude_scopes", self.exclude_scopes))
        object.__setattr__(self, "slow_nodes", frozenset(_names("slow_nodes", self.slow_nodes)))
        _check_switches(self)
        if not isinstance(self.level, str):
            raise TypeError(f"level must be a string, got {self.level!r}")
        object.__setattr__(self, "level", self.level.upper())
        if self.log_dir is not None:
            if not isinstance(self.log_dir, (str, os.PathLike)):
                raise TypeError(f"log_dir must be a path or None, got {self.log_dir!r}")
            object.__setattr__(self, "log_dir", os.fspath(self.log_dir))
        _check_choice("target_dtype", self.target_dtype, ("auto",) + RESOLVED_TARGETS)
        _check_choice("eligible_devices", self.eligible_devices, ELIGIBLE_DEVICES)
        _check_choice("opt_level", self.opt_level, OPT_LEVELS)
        _check_choice("level", self.level, LEVELS)
        _check_choice("default_device_type", self.default_device_type, ("CPU", "GPU", "auto"))
        if self.default_device_type == "auto":
            object.__setattr__(self, "default_device_type", local_device_type())
        self._resolve_target()
        if self.lists is not None and not isinstance(self.lists, OpLists):
            raise TypeError(f"lists must be an OpLists or None, got {type(self.lists).__name__}")
        object.__setattr__(self, "list_edits", _checked_edits(self.list_edits))
        if self.list_edits:
            self.resolved_lists()  # an op added to two lists is an error now, not at the rewrite

    def _resolve_target(self) -> None:
        """Turns "auto" into the dtype chosen for ``default_device_type``, with its reason."""
        if self.target_dtype == "auto":
            choice = hardware.choose_target(self.default_device_type)
        elif not self.target_reason:
            auto = hardware.choose_target(self.default_device_type)
            choice = hardware.forced_target(self.target_dtype, auto)
        else:
            return
        object.__setattr__(self, "target_dtype", choice.dtype)
        object.__setattr__(self, "target_reason", choice.reason)

    @property
    def guards_normalization(self) -> bool:
        """Whether the painter keeps normalizations' cancelling sums float32 (see the field)."""
        return self._guard_on(self.guard_normalization, default_for="float16")

    @property
    def guards_updates(self) -> bool:
        """Whether the painter keeps update-only arithmetic float32 (see the field)."""
        return self._guard_on(self.guard_updates, default_for="bfloat16")

    @property
    def guards_losses(self) -> bool:
        """Whether the painter keeps Keras's compiled loss float32 (see the field)."""
        return self._guard_on(self.guard_losses, default_for=("float16", "bfloat16"))

    @property
    def guards_accumulators(self) -> bool:
        """Whether the painter keeps loops' running sums float32 (see the field)."""
        return self._guard_on(self.guard_accumulators, default_for=("float16", "bfloat16"))

    @property
    def guards_constant_range(self) -> bool:
        """Whether readers of a constant beyond the target's range (other than sums, selects
        and bounds, which take it as a sentinel) stay float32: always, but at O3 and
        ``UNSAFE_FORCE_ALL``, which ask for every op."""
        return not self._asks_for_every_op

    @property
    def selects_before_cast(self) -> bool:
        """Whether selections from weight tables stay float32 (see the field)."""
        return self.select_before_cast and not self._asks_for_every_op

    def _guard_on(self, asked: bool | None, default_for: str | tuple[str, ...]) -> bool:
        """A guard's setting: never at O3 / UNSAFE_FORCE_ALL, which ask for every op; else
        as ``asked``, or (None) on for the targets it was measured to help."""
        if self._asks_for_every_op:
            return False
        targets = (default_for,) if isinstance(default_for, str) else default_for
        return asked if asked is not None else self.target_dtype in targets

    @property
    def _asks_for_every_op(self) -> bool:
        """O3 / UNSAFE_FORCE_ALL: every op that can turn half does, so no guard holds one."""
        return self.opt_level == "O3" or self.level == "UNSAFE_FORCE_ALL"

    @property
    def rewrites(self) -> bool:
        """False when the target is float32 (no fast reduced precision): nothing to rewrite."""
        return self.target_dtype != "float32" and self.opt_level != "O0"

    def resolved_lists(self) -> OpLists:
        """The lists the painter uses: ``lists`` (or the target's defaults) with
        ``list_edits`` and ``level`` applied."""
        base = self.lists if self.lists is not None else OpLists.default(
            _lists_target(self.target_dtype)
        )
        return base.edited_at_level(self.list_edits, self.level, self.target_dtype)

    def replace(self, **changes: Any) -> RewriteConfig:
        """A copy with some fields changed (validated again; a new target gets a new reason)."""
        if "target_dtype" in changes and "target_reason" not in changes:
            changes["target_reason"] = ""
        return replace(self, **changes)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> RewriteConfig:
        """A config from the environment; keyword ``overrides`` win over the environment.

        Raises ValueError naming the variable when a value is not understood.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        requested = overrides.get("target_dtype") or parse_choice(
            env, "TF_AMP_TARGET_DTYPE", TARGET_DTYPES, "auto"
        )
        values["target_dtype"] = requested
        values["opt_level"] = parse_choice(env, "TF_AMP_OPT_LEVEL", OPT_LEVELS, "O1", upper=True)
        values["eligible_devices"] = parse_choice(
            env, "TF_AMP_ELIGIBLE_DEVICES", ELIGIBLE_DEVICES, "all"
        )
        values["level"] = parse_choice(env, LEVEL_ENV, LEVELS, "", upper=True)
        for var in LOG_PATH_ENVS:
            if env.get(var, "").strip():
                values["log_dir"] = env[var].strip()
                break
        scopes = split_op_names(env.get("TF_AMP_EXCLUDE_SCOPES", ""))
        if scopes:
            values["exclude_scopes"] = tuple(scopes)
        values["check_kernels"] = flag_or(env, "TF_AMP_CHECK_KERNELS", True)
        values["probe"] = flag_or(env, "TF_AMP_PROBE", False)
        values["infer_follows_allow"] = flag_or(env, "TF_AMP_INFER_FOLLOWS_ALLOW", True)
        values["guard_normalization"] = parse_flag(env, "TF_AMP_GUARD_NORMALIZATION")
        values["guard_updates"] = parse_flag(env, "TF_AMP_GUARD_UPDATES")
        values["guard_losses"] = parse_flag(env, "TF_AMP_GUARD_LOSSES")
        values["guard_accumulators"] = parse_flag(env, "TF_AMP_GUARD_ACCUMULATORS")
        values["select_before_cast"] = flag_or(env, "TF_AMP_SELECT_BEFORE_CAST", True)
        overrides = dict(overrides)
        base_lists = overrides.pop("lists", None)
        if requested == "auto":
            # Resolved here, not in __post_init__: the lists below depend on the target.
            device = overrides.get("default_device_type", "auto")
            choice = hardware.choose_target(local_device_type() if device == "auto" else device)
            values["target_dtype"], values["target_reason"] = choice.dtype, choice.reason
        values["lists"] = base_lists
        values["list_edits"] = tuple(list_edits_from_env(env))
        try:
            OpLists.default().with_edits(values["list_edits"])
        except ValueError as err:
            raise ValueError(f"Bad list environment variable: {err}") from err
        values.update(overrides)
        names = {f.name for f in fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise TypeError(f"Unknown RewriteConfig field(s): {sorted(unknown)}")
        return cls(**values)


def _lists_target(target_dtype: str) -> str:
    """Whose default lists a target uses: a float32 target rewrites nothing, so any will do."""
    return "float16" if target_dtype == "float32" else target_dtype


def _names(name: str, value: object) -> tuple[str, ...]:
    """The names a field holds, checked: a collection of strings. One bare string would be
    read as its letters ("Identity" -> {"I", "d", ...}), which protects or excludes nothing
    and says nothing, so it is an error."""
    if isinstance(value, (str, bytes)):
        raise TypeError(
            f"{name} must be a collection of names, not one string: pass ({value!r},)"
        )
    names = tuple(value) if isinstance(value, Iterable) else None
    if names is None or not all(isinstance(v, str) for v in names):
        raise TypeError(f"{name} must be a collection of names (strings), got {value!r}")
    return names


# Fields that are on or off; the guards' None means "the target's default".
_SWITCHES = ("preserve_names", "check_kernels", "rewrite_functions", "fold_constant_casts",
             "infer_follows_allow", "probe", "select_before_cast")
_TRI_STATE_SWITCHES = (
    "guard_normalization", "guard_updates", "guard_losses", "guard_accumulators"
)


def _check_switches(config: RewriteConfig) -> None:
    """Each on/off field holds a bool: ``probe="0"`` or ``guard_updates="off"`` would be
    truthy, the opposite of what was asked, so they are errors (numpy's bool_ is accepted)."""
    for name in _SWITCHES + _TRI_STATE_SWITCHES:
        value = getattr(config, name)
        if value is None and name in _TRI_STATE_SWITCHES:
            continue
        if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
            value = bool(value)
            object.__setattr__(config, name, value)
        if not isinstance(value, bool):
            allowed = "True, False or None" if name in _TRI_STATE_SWITCHES else "True or False"
            raise TypeError(f"{name} must be {allowed}, got {value!r}")
    if not isinstance(config.target_reason, str):
        raise TypeError(f"target_reason must be a string, got {config.target_reason!r}")


def _checked_edits(edits: object) -> tuple[tuple[str, ...], ...]:
    """``list_edits`` as a tuple of ``(list, "ADD"|"REMOVE", op[, source])`` string tuples."""
    if isinstance(edits, (str, bytes)) or not isinstance(edits, Iterable):
        raise TypeError(f"list_edits must be a collection of (list, verb, op) tuples, "
                        f"got {edits!r}")
    checked = []
    for edit in edits:
        edit = tuple(edit) if isinstance(edit, (tuple, list)) else None
        if (edit is None or len(edit) not in (3, 4) or not all(isinstance(e, str) for e in edit)
                or edit[0] not in LIST_NAMES or edit[1] not in ("ADD", "REMOVE")):
            raise TypeError(
                f"each of list_edits must be (list, 'ADD' or 'REMOVE', op[, source]) with list "
                f"one of {LIST_NAMES}, got {edit!r}")
        checked.append(edit)
    return tuple(checked)


def _check_choice(name: str, value: object, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
