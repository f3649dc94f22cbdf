"""Every private Keras symbol tf_amp uses (``keras.src.*``), and why.

Importing this module checks the TensorFlow and Keras releases against
:mod:`tf_amp._upstream.versions` first (through :mod:`tf_amp._upstream.tensorflow`).

The symbols:

* ``Trainer`` -- the class that defines ``compile``, which the Keras adapter patches. Not
  ``keras.Model``: ``compile_from_config`` (run by ``load_model``) treats a model whose
  ``type(model).compile`` is not ``Trainer.compile`` as having its own ``compile`` and then skips
  compiling, so a ``.keras`` file would load without its optimizer while a patch sat on
  ``keras.Model``. Patched on ``Trainer``, every model still resolves to the patch.
* ``TensorFlowTrainer`` -- the class that defines ``make_train_function`` and its test / predict
  twins: a model compiled before the rewrite was enabled is caught at its first ``fit`` there.
* ``reduce_per_replica`` -- how Keras combines the per-replica outputs of one step; the
  rewritten step must return them exactly as Keras's own step does.

  Why the adapter builds the step loop itself instead of calling Keras's
  ``make_train_function`` with the step swapped: Keras wraps the per-batch step in
  ``tf.function`` inside that method (looked up as the public ``tf.function`` at call time),
  and the rewrite must own that function, with ``distribute_strategy.run`` and the per-replica
  reduction inside it. Handing Keras a rewritten ``train_step`` instead would nest a function
  inside each replica, where the gradient all-reduce's ``merge_call`` is refused under
  ``MirroredStrategy``; swapping ``tf.function`` while Keras builds would change it for the
  whole process. So :mod:`tf_amp.runtime.keras_steps` mirrors Keras's loop (steps per
  execution, end of data), built from public TensorFlow ops.
* ``legacy_h5_format`` -- its ``save_model_to_hdf5`` is patched under the environment
  activation, so a ``.h5`` file stores the script's own optimizer rather than the wrapper the
  environment put around it (plain Keras could not load the file otherwise).
* ``KerasSaveable`` -- the base of an object Keras's ``.keras`` writer visits; the loss-scale
  state is saved as one such entry of its own, which a plain optimizer ignores.
* ``no_automatic_dependency_tracking`` -- the wrapper's loss-scale variables and inner build are
  created without Keras tracking them a second time (their layout in saved files is set by
  hand, see ``tf_amp.optimizers._checkpoint_layout``).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tf_amp._upstream import tensorflow as _checked_tensorflow  # noqa: F401 - checks TF first
from tf_amp._upstream import versions

versions.enforce(tf.__version__, keras.__version__)

# Imported after the check (E402 on purpose): on an unsupported release they may be missing.
# ruff: noqa: E402
from keras.src.backend.tensorflow.trainer import (
    TensorFlowTrainer,
    reduce_per_replica,
)
from keras.src.legacy.saving import legacy_h5_format
from keras.src.saving.keras_saveable import KerasSaveable
from keras.src.trainers.trainer import Trainer
from keras.src.utils.tracking import no_automatic_dependency_tracking

__all__ = [
    "KerasSaveable",
    "TensorFlowTrainer",
    "Trainer",
    "legacy_h5_format",
    "no_automatic_dependency_tracking",
    "reduce_per_replica",
]
