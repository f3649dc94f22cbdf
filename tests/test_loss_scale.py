"""The loss-scale state machine against a plain-Python reference model (float32 arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_amp.loss_scale import (
    DynamicLossScale,
    LossScaleState,
    StaticLossScale,
    deserialize,
    get,
    serialize,
)


def reference_dynamic(policy: DynamicLossScale, finite_seq: list[bool]) -> list[tuple]:
    """The algorithm of the DynamicLossScale docstring, line by line, in numpy float32."""
    f32 = np.float32
    scale, good, skipped, consecutive, floor = f32(policy.initial_scale), 0, 0, 0, 0
    states = []
    for finite in finite_seq:
        if finite:
            consecutive, floor = 0, 0
            good += 1
            if good >= policy.growth_interval:
                good = 0
                grown = min(f32(scale * f32(policy.growth_factor)), f32(policy.max_scale))
                scale = max(scale, grown)
        else:
            skipped += 1
            consecutive += 1
            good = 0
            if scale <= f32(policy.min_scale):
                floor += 1
            backed_off = max(f32(scale * f32(policy.backoff_factor)), f32(policy.min_scale))
            scale = min(scale, backed_off)
        assert np.isfinite(scale)
        states.append((float(scale), good, skipped, consecutive, floor))
    return states


@tf.function
def run_policy(policy_steps: tf.Tensor, state: LossScaleState, policy) -> tf.Tensor:
    """Runs adjust over a bool sequence in a graph loop; returns one row per step."""
    rows = tf.TensorArray(tf.float64, size=tf.shape(policy_steps)[0])
    for i in tf.range(tf.shape(policy_steps)[0]):
        state = policy.adjust(state, policy_steps[i])
        rows = rows.write(i, tf.stack([tf.cast(x, tf.float64) for x in state]))
    return rows.stack()


def as_tuples(rows: np.ndarray) -> list[tuple]:
    return [(float(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows]


scales = st.sampled_from([2.0**k for k in range(-3, 30)] + [3.0, 1000.0, 2.0**24 + 5.0])


@st.composite
def dynamic_policies(draw):
    a, b, c = sorted(draw(st.lists(scales, min_size=3, max_size=3)))
    return DynamicLossScale(
        initial_scale=b,
        growth_interval=draw(st.integers(1, 6)),
        growth_factor=draw(st.sampled_from([2.0, 3.0, 1.5, 1e30])),
        backoff_factor=draw(st.sampled_from([0.5, 0.25, 0.9])),
        min_scale=a,
        max_scale=c,
    )


@settings(max_examples=60, deadline=None)
@given(dynamic_policies(), st.lists(st.booleans(), min_size=1, max_size=80))
def test_dynamic_matches_reference_model(policy, finite_seq):
    rows = run_policy(tf.constant(finite_seq), policy.initial_state(), policy).numpy()
    assert as_tuples(rows) == reference_dynamic(policy, finite_seq)
    assert all(np.float32(policy.min_scale) <= r[0] <= np.float32(policy.max_scale) for r in rows)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40), scales)
def test_static_never_changes_but_counts_skips(finite_seq, scale):
    policy = StaticLossScale(scale)
    rows = run_policy(tf.constant(finite_seq), policy.initial_state(), policy).numpy()
    assert {float(r[0]) for r in rows} == {float(np.float32(scale))}
    assert int(rows[-1][2]) == finite_seq.count(False)
    assert all(int(r[4]) == 0 for r in rows)


def test_default_schedule_doubles_after_2000_and_halves_on_overflow():
    policy = DynamicLossScale()
    rows = as_tuples(
        run_policy(tf.constant([True] * 2000 + [False]), policy.initial_state(), policy).numpy()
    )
    assert rows[1998][0] == 2.0**15 and rows[1998][1] == 1999
    assert rows[1999][:2] == (2.0**16, 0)
    assert rows[2000] == (2.0**15, 0, 1, 1, 0)


def test_growth_stops_at_ceiling_and_never_reaches_inf():
    policy = DynamicLossScale(
        initial_scale=2.0**100,
        growth_interval=1,
        growth_factor=1e30,
        max_scale=float(tf.float32.max),
    )
    rows = as_tuples(run_policy(tf.constant([True] * 5), policy.initial_state(), policy).numpy())
    assert rows[-1][0] == float(tf.float32.max)


@pytest.mark.parametrize(
    "scale, finite, want",
    [
        (2.0**27, True, 2.0**27),  # above the cap (a restored Keras scale): growth keeps it
        (2.0**27, False, 2.0**26),  # a skip still halves it
        (0.25, False, 0.25),  # below the floor: a skip never raises it (it went to 1)
        (0.25, True, 0.5),  # growth doubles it as usual
        (float("inf"), False, 2.0**24),  # Keras's scale grows into inf: a skip brings it back
    ],
)
def test_a_scale_outside_the_bounds_moves_the_right_way(scale, finite, want):
    """Only a restored Keras checkpoint or set_loss_scale puts the scale outside the bounds;
    a growth step cut 2**27 to 2**24 and a skip raised 0.25 to 1, and an inf scale skipped
    every step for ever."""
    policy = DynamicLossScale(initial_scale=2.0, growth_interval=1)
    state = policy.initial_state()._replace(scale=tf.constant(scale, tf.float32))
    assert float(policy.adjust(state, finite).scale) == want


def test_floor_skips_count_only_at_the_floor():
    policy = DynamicLossScale(initial_scale=4.0, min_scale=1.0)
    rows = as_tuples(
        run_policy(tf.constant([False] * 5 + [True]), policy.initial_state(), policy).numpy()
    )
    # 4 -> 2 -> 1 (two halvings), then three skips at the floor, then a finite step resets it.
    assert [r[0] for r in rows] == [2.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert [r[4] for r in rows] == [0, 0, 1, 2, 3, 0]
    assert [r[3] for r in rows] == [1, 2, 3, 4, 5, 0]


def test_adjust_works_eagerly_on_python_bools():
    policy = DynamicLossScale(initial_scale=8.0)
    state = policy.adjust(policy.initial_state(), False)
    assert float(state.scale) == 4.0 and int(state.skipped_steps) == 1


def test_scale_multiplies_half_losses_in_float32():
    policy = DynamicLossScale(initial_scale=2.0**24)
    scaled = policy.scale(tf.constant(100.0, tf.float16), policy.initial_state())
    assert scaled.dtype == tf.float32 and np.isfinite(scaled.numpy())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"growth_interval": 0}, "growth_interval"),
        ({"growth_interval": 2.5}, "growth_interval"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"max_scale": float("inf")}, "max_scale"),
        ({"min_scale": 0.0}, "min_scale"),
        ({"initial_scale": 0.5, "min_scale": 1.0}, "min_scale <= initial_scale"),
        ({"initial_scale": 2.0**30}, "min_scale <= initial_scale <= max_scale"),
    ],
)
def test_invalid_dynamic_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicLossScale(**kwargs)


def test_get_and_serialization_round_trip():
    assert get("dynamic") == DynamicLossScale()
    assert get(128) == StaticLossScale(128.0)
    custom = DynamicLossScale(initial_scale=4.0, growth_interval=7)
    assert get(custom) is custom
    assert deserialize(serialize(custom)) == custom
    assert deserialize(serialize(StaticLossScale(3.0))) == StaticLossScale(3.0)
    with pytest.raises(ValueError, match='pass "dynamic"'):
        get("dynamc")
    with pytest.raises(TypeError, match="loss_scale must be"):
        get([1.0])
    with pytest.raises(ValueError, match="finite number > 0"):
        get(float("nan"))


@pytest.mark.parametrize(
    "number",
    [
        np.float32(128),
        np.int64(128),
        np.array(128.0),
        tf.constant(128.0),
        tf.constant(128),
        tf.constant(128.0, tf.bfloat16),
    ],
)
def test_get_takes_one_number_of_any_kind(number):
    """NumPy scalars, 0-d arrays and eager tensors are static scales, as Keras's own wrapper
    takes them for ``initial_scale``."""
    assert get(number) == StaticLossScale(128.0)


@pytest.mark.parametrize(
    "value", [True, np.bool_(True), np.array([128.0]), tf.constant([128.0]), tf.constant(True)]
)
def test_get_refuses_what_is_not_one_number(value):
    with pytest.raises(TypeError, match="loss_scale must be"):
        get(value)


def test_get_refuses_a_graph_tensor():
    """A scale is fixed when the policy is made; a symbolic tensor has no value yet."""

    with tf.Graph().as_default(), pytest.raises(TypeError, match="loss_scale must be"):
        get(tf.constant(128.0))
