#!/usr/bin/env python3
"""Which of TFF's static Grappler optimizers moves a float64 DCCO round off the centralized step?
(Issue 52: with the pass on, as bin/train runs, the round missed the step by ~1e-6 of the update's
largest entry; the cause was constant folding's x / 255 -> x * (1 / 255), BUILD-notes, "Images to
floats".) Runs tests/methods/test_dcco_statistics.py's round (ResNet-14, 21 images over 7 clients)
compiled with only the named optimizers on, and prints the gap.

  .venv/bin/python tools/grappler_bisect.py                       # TFF's own set, then none
  .venv/bin/python tools/grappler_bisect.py constant_folding vicreg
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tff_ssl import runtime  # noqa: E402

runtime.install()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
# pylint: disable=g-import-not-at-top
from tensorflow_federated.python.core.backends.native import compiler  # noqa: E402
from tensorflow_federated.python.core.environments.tensorflow_backend import (  # noqa: E402
    tensorflow_tree_transformations)
from tensorflow_federated.python.core.impl.computation import computation_impl  # noqa: E402
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # noqa: E402

from tests.methods import test_dcco_statistics as equivalence  # noqa: E402

# TFF's own set (`desugar_and_transform_to_native`) turns these to AGGRESSIVE; the rest stay at their
# defaults (on).
TFF_AGGRESSIVE = ("memory_optimization", "constant_folding", "arithmetic_optimization",
                  "loop_optimization", "function_optimization")
OTHERS = ("layout_optimizer", "shape_optimization", "remapping", "dependency_optimization",
          "debug_stripper", "common_subgraph_elimination", "implementation_selector",
          "pin_to_host_optimization", "scoped_allocator_optimization")


def compile_with(optimizers):
  """TFF's compiler with only `optimizers` on."""
  def compile_fn(comp):
    config = tf.compat.v1.ConfigProto()
    options = config.graph_options.rewrite_options
    for name in TFF_AGGRESSIVE + OTHERS:
      setattr(options, name, options.OFF)
    for name in optimizers:
      setattr(options, name, options.AGGRESSIVE if name in TFF_AGGRESSIVE else options.ON)
    block, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
        comp.to_building_block())
    return compiler.transform_to_native_form(computation_impl.ConcreteComputation(
        computation_proto=block.proto, context_stack=context_stack_impl.context_stack),
        grappler_config=config)
  return compile_fn


def gap(optimizers, loss: str) -> float:
  compiler.desugar_and_transform_to_native = compile_with(optimizers)
  runtime.configure_context(static_graph_optimization=True)
  tf.keras.backend.set_floatx("float64")
  model = equivalence.functional_model(equivalence.SHAPE)
  images, ids, data = equivalence.client_data(equivalence.SHAPE, np.arange(21))
  return equivalence.round_gap(equivalence.process_of(model, loss),
                               equivalence.centralized_update(model, loss, images, ids), data)


def main(argv):
  loss = argv[2] if len(argv) > 2 else "cco"
  sets = [argv[1].split(",")] if len(argv) > 1 and argv[1] else [list(TFF_AGGRESSIVE), []]
  for optimizers in sets:
    print(f"{loss}, static Grappler with {optimizers or 'nothing'}: the round is "
          f"{gap(optimizers, loss):.3g} of the update's largest entry off the centralized step")


if __name__ == "__main__":
  main(sys.argv)
