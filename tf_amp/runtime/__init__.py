"""Runtime adapters: run the mixed-precision rewrite of graphs users already build.

TensorFlow 2 offers no hook to run a Python rewrite inside Grappler, so each way in rewrites the
graph itself and runs the result:

* :mod:`tf_amp.runtime.function` -- ``tf_amp.function``, a ``tf.function`` whose traced graph is
  rewritten, rebuilt bound to the original variables, and cached per input signature.
* :mod:`tf_amp.runtime.keras_fit` -- Keras 3 ``fit`` runs the rewritten train step.
* :mod:`tf_amp.runtime.session` -- ``tf_amp.Session`` for TF1 graphs (and its
  ``InteractiveSession`` form; ``MonitoredSession`` gets it through ``SessionManager``).
* :mod:`tf_amp.runtime.activation` -- ``TF_ENABLE_AUTO_MIXED_PRECISION`` and its reversible
  patches; :mod:`tf_amp.runtime.auto_loss_scale` -- loss scaling for scripts that never asked
  for it; :mod:`tf_amp.runtime.autoenable` -- what the startup ``.pth`` imports when a variable
  is set; :mod:`tf_amp.runtime.hook_install` -- put that ``.pth`` into site-packages by hand.

Submodules are imported on demand; importing this package imports nothing heavy.
"""
