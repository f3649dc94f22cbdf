"""How the Keras wrapper appears in ``.keras`` and ``.h5`` files when it saves as its inner
optimizer (the wrapper the environment activation puts around a script's own optimizer).

Such files hold that optimizer's variables laid out as the optimizer itself saves them, so
they stay interchangeable with float32 runs both ways; the loss-scale state goes to an entry of
its own (``loss_scale_state``) that a plain optimizer never reads.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from tf_amp._upstream.keras import KerasSaveable


class StateEntry(KerasSaveable):
    """The loss-scale state variables as a .keras file entry of their own.

    Keras saves every saveable attribute of the optimizer under its own path; a file loaded by
    a plain optimizer ignores this one, and a float32 file (no entry) leaves the state as built.
    """

    def __init__(self, wrapper: Any) -> None:
        self._wrapper_ref = weakref.ref(wrapper)

    def _obj_type(self) -> str:
        return "Optimizer"  # a type Keras's saving knows; nothing here is walked further

    def _state_vars(self) -> list[Any]:
        wrapper = self._wrapper_ref()
        return list(getattr(wrapper, "_state_vars", [])) if wrapper is not None else []

    def save_own_variables(self, store: Any) -> None:
        for i, variable in enumerate(self._state_vars()):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        variables = self._state_vars()
        if len(store.keys()) == len(variables):
            for i, variable in enumerate(variables):
                variable.assign(store[str(i)])


class SavesAsInner:
    """Mixin of the Keras wrapper: its saving methods, which follow ``saves_as_inner``."""

    # Set on the wrapper the environment activation puts around a script's own optimizer: its
    # .keras files then hold that optimizer's variables laid out as the optimizer itself saves
    # them, so files stay interchangeable with float32 runs both ways; the loss-scale state
    # goes to an entry of its own (``loss_scale_state``) that a plain optimizer never reads.
    saves_as_inner = False

    @property
    def loss_scale_state(self) -> Any:
        """The state's entry in a .keras file of a ``saves_as_inner`` wrapper, else None."""
        if not self.saves_as_inner:
            return None
        entry = self.__dict__.get("_tf_amp_state_entry")
        if entry is None:
            entry = StateEntry(self)
            object.__setattr__(self, "_tf_amp_state_entry", entry)
        return entry

    def save_own_variables(self, store: Any) -> None:
        if self.saves_as_inner:
            self.inner_optimizer.save_own_variables(store)
        else:
            super().save_own_variables(store)

    def load_own_variables(self, store: Any) -> None:
        inner = self.inner_optimizer
        if self.saves_as_inner and len(store.keys()) == len(inner.variables):
            inner.load_own_variables(store)
            # Keras then visits inner_optimizer as a child of its own: in a float32 file that
            # entry is empty, and the inner optimizer would warn that it skipped loading the
            # state it was just given.
            load_inner = type(inner).load_own_variables

            def load_unless_empty(store: Any) -> None:
                if len(store.keys()):
                    load_inner(inner, store)

            inner.load_own_variables = load_unless_empty
        else:
            super().load_own_variables(store)

    def set_weights(self, weights: Sequence[Any]) -> None:
        """A ``saves_as_inner`` wrapper passes the weights to its inner optimizer: a ``.h5``
        file, float32 or saved under the environment, holds the inner optimizer's weights, and
        it loads them exactly as the plain optimizer would (Keras's ``set_weights``)."""
        if self.saves_as_inner:
            self.inner_optimizer.set_weights(weights)
        else:
            super().set_weights(weights)
