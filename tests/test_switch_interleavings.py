"""The two switches in every order: the patches installed are exactly those the switches still
on need, and with both off TensorFlow and Keras are exactly as before (identity-checked).

Switches: the environment activation (``activate`` / ``deactivate``, both halves on) and
``enable_mixed_precision_graph_rewrite`` of a Keras optimizer (``enable`` / ``disable``). Both
need ``Trainer.compile``; they share that one patch through the registry.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

import keras
import pytest
import tensorflow as tf

import tf_amp
from tf_amp._upstream import keras as upstream_keras
from tf_amp._upstream import tensorflow as upstream_tf
from tf_amp.optimizers import _v1_saver
from tf_amp.runtime import _patches, activation, keras_fit, tf_keras_fit
from tf_amp.runtime.activation import Settings

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _activation_keys() -> set[tuple[Any, str]]:
    v1_opt = tf.compat.v1.train.Optimizer
    # tf.compat.v1, and tensorflow.compat.v1 once a test imported it (another module object)
    compat_v1 = {id(m): m for m in (tf.compat.v1, sys.modules.get("tensorflow.compat.v1")) if m}
    return {
        (tf, "function"),
        *((module, name) for module in compat_v1.values()
          for name in ("Session", "InteractiveSession", "disable_eager_execution")),
        (upstream_tf.session_manager, "session"),
        (tf.GradientTape, "gradient"),
        (v1_opt, "minimize"),
        (v1_opt, "compute_gradients"),
        (v1_opt, "apply_gradients"),
        (v1_opt, "variables"),
        (tf.compat.v1.train.Saver, "build"),
        (tf.compat.v1.train.Saver, "restore"),
        (upstream_keras.Trainer, "compile"),
        # the step builders' late hook: a model never compiled under the switch (predict)
        (upstream_keras.TensorFlowTrainer, "make_train_function"),
        (upstream_keras.TensorFlowTrainer, "make_test_function"),
        (upstream_keras.TensorFlowTrainer, "make_predict_function"),
        (keras.optimizers.Optimizer, "apply"),
        (keras.optimizers.Optimizer, "scale_loss"),
        (keras.optimizers.LossScaleOptimizer, "scale_loss"),
        (upstream_keras.legacy_h5_format, "save_model_to_hdf5"),
    }


def _tf_keras_activation_keys() -> set[tuple[Any, str]]:
    """What the activation patches on tf_keras, when another test of this process loaded it
    (the activation patches tf_keras only once it is imported; nothing here imports it)."""
    if "tf_keras" not in sys.modules:
        return set()
    from tf_amp._upstream import tf_keras as upstream_tf_keras

    model = upstream_tf_keras.model_class()
    keys = {(model, name) for name in
            ("make_train_function", "make_test_function", "make_predict_function", "compile")}
    _, current, legacy = upstream_tf_keras.loss_scale_optimizer_classes()
    return (
        keys
        | {(base, "apply_gradients") for base in upstream_tf_keras.optimizer_bases()}
        | {(wrapper, "get_scaled_loss") for wrapper in (current, legacy)}
        | {(owner, "save_model") for owner in upstream_tf_keras.save_model_owners()}
    )


def _enable_keys() -> set[tuple[Any, str]]:
    builders = upstream_keras.TensorFlowTrainer
    return {
        (upstream_keras.Trainer, "compile"),
        (builders, "make_train_function"),
        (builders, "make_test_function"),
        (builders, "make_predict_function"),
    }


def _snapshot() -> dict[tuple[int, str], tuple[bool, Any, Any]]:
    """Every key's own value (``vars`` for classes), whether the owner held it, and what a
    lookup resolves to."""
    keys = _activation_keys() | _enable_keys() | _tf_keras_activation_keys()
    result = {}
    for owner, name in keys:
        own = vars(owner) if isinstance(owner, type) else owner.__dict__
        result[(id(owner), name)] = (name in own, own.get(name), getattr(owner, name))
    return result


def _same(before: dict, after: dict) -> list[str]:
    differ = []
    for key, (had, value, resolved) in before.items():
        had2, value2, resolved2 = after[key]
        if had != had2 or value is not value2 or resolved is not resolved2:
            differ.append(key[1])
    return differ


def _model() -> keras.Model:
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])


class _Switches:
    """Turns the switches and knows what must be installed."""

    def __init__(self) -> None:
        self.active = False
        self.enabled = False
        self.marked_optimizer: Any = None

    def activate(self) -> None:
        activation.activate(Settings(graph_rewrite=True, loss_scaling=True))
        self.active = True

    def deactivate(self) -> None:
        activation.deactivate()
        self.active = False

    def enable(self) -> None:
        self.marked_optimizer = tf_amp.enable_mixed_precision_graph_rewrite(
            keras.optimizers.SGD(0.1)
        )
        self.enabled = True

    def disable(self) -> None:
        tf_amp.disable_mixed_precision_graph_rewrite()
        self.enabled = False

    def expected(self) -> dict[tuple[Any, str], frozenset[str]]:
        holders: dict[tuple[Any, str], set[str]] = {}
        if self.active:
            for key in _activation_keys():
                holders.setdefault(key, set()).add(_patches.ACTIVATION)
            for key in _tf_keras_activation_keys():
                holders.setdefault(key, set()).add(tf_keras_fit.HOLDERS["env"])
        if self.enabled:
            for key in _enable_keys():
                holders.setdefault(key, set()).add(_patches.ENABLE)
        return {key: frozenset(h) for key, h in holders.items()}

    def check(self) -> None:
        installed = _installed_by_switches()
        assert installed == self.expected()
        assert activation.patch_count() == (len(_activation_keys()) if self.active else 0)
        # Real models: a plain optimizer's model is hooked exactly while the env rewrite is on;
        # the marked optimizer's model while any switch that hooks compile is on.
        plain = _model()
        plain.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        assert keras_fit.is_installed(plain) == self.active
        assert (type(plain.optimizer).__name__ == "KerasLossScaleOptimizer") == self.active
        if self.marked_optimizer is not None:
            marked = _model()
            marked.compile(optimizer=self.marked_optimizer, loss="mse")
            assert keras_fit.is_installed(marked) == (self.active or self.enabled)


def _installed_by_switches() -> dict[tuple[Any, str], frozenset[str]]:
    """The registry's patches and holders, less the Saver patches a v1 loss-scale wrapper
    installs for good (an earlier test file in this worker process may have made one)."""
    installed = {}
    for key, holders in _patches.REGISTRY.installed().items():
        holders = holders - {_v1_saver.SAVER_HOLDER}
        if holders:
            installed[key] = holders
    return installed


STEPS = ("activate", "enable", "deactivate", "disable")


def _valid_orders() -> list[tuple[str, ...]]:
    """Every order of the four steps in which each switch is turned on before it is turned
    off (six orders: the interleavings that matter)."""
    orders = []
    for order in itertools.permutations(STEPS):
        if order.index("activate") < order.index("deactivate") and order.index(
            "enable"
        ) < order.index("disable"):
            orders.append(order)
    return orders


@pytest.mark.parametrize("order", _valid_orders(), ids=lambda o: "-".join(o))
def test_each_step_leaves_exactly_the_patches_still_needed(order: tuple[str, ...]) -> None:
    before = _snapshot()
    switches = _Switches()
    try:
        for step in order:
            getattr(switches, step)()
            switches.check()
    finally:
        activation.deactivate()
        tf_amp.disable_mixed_precision_graph_rewrite()
    assert _installed_by_switches() == {}
    assert _same(before, _snapshot()) == []


def test_afterwards_a_plain_model_trains_with_keras_s_own_step() -> None:
    before = _snapshot()
    switches = _Switches()
    for step in ("activate", "enable", "deactivate", "disable"):
        getattr(switches, step)()
    assert _same(before, _snapshot()) == []
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = tf.random.stateless_normal((8, 4), seed=(1, 2))
    model.fit(x, tf.zeros((8, 2)), epochs=1, verbose=0)
    assert keras_fit.rewritten_functions(model) == {}
    assert type(model.optimizer) is keras.optimizers.SGD


def test_the_old_bug_order_keeps_no_activation_patch_behind() -> None:
    """activate -> enable -> deactivate -> disable used to leave the activation's compile
    patch installed while its patch count said 0."""
    original_compile = vars(upstream_keras.Trainer)["compile"]
    switches = _Switches()
    for step in ("activate", "enable", "deactivate"):
        getattr(switches, step)()
    assert activation.patch_count() == 0
    assert _patches.REGISTRY.installed()[(upstream_keras.Trainer, "compile")] == {
        _patches.ENABLE
    }
    switches.disable()
    assert vars(upstream_keras.Trainer)["compile"] is original_compile


def test_the_registry_refuses_a_second_replacement_of_one_attribute() -> None:
    class Owner:
        def method(self) -> str:
            return "original"

    registry = _patches.PatchRegistry()
    registry.acquire("a", Owner, "method", lambda original: lambda self: "patched")
    with pytest.raises(ValueError, match="another replacement"):
        registry.acquire("b", Owner, "method", lambda original: lambda self: "other")
    registry.release("a")
    assert Owner().method() == "original"


def test_an_inherited_attribute_is_deleted_again_not_copied_down() -> None:
    class Base:
        def method(self) -> str:
            return "base"

    class Child(Base):
        pass

    def make(original: Any) -> Any:
        return lambda self: "patched " + original(self)

    registry = _patches.PatchRegistry()
    registry.acquire("a", Child, "method", make)
    registry.acquire("b", Child, "method", make)  # joins: same replacement
    assert Child().method() == "patched base"
    registry.release("a")
    assert Child().method() == "patched base"  # "b" still holds it
    registry.release("b")
    assert "method" not in vars(Child) and Child().method() == "base"
