"""A Keras model as a pure function of a flat list of weight tensors, for use inside TFF computations.

TFF computations pass model weights as values, not variables. `FunctionalModel` rebuilds the Keras model
under a `tf.variable_creator_scope` that hands out the given tensors in place of new variables (the
mechanism of `tff.learning.models.functional_model_from_keras`, which we do not use directly because it
forces a supervised `loss(output, label)` interface and a (trainable, non_trainable) split that SSL
models with two heads and no labels do not have). Gradients are taken with respect to the weight tensors.
Use inside a `tf.function` or `tff.tensorflow.computation`: every call rebuilds the model (once per
trace).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf


def _is_keras_counter(kwargs) -> bool:
  """Keras' Model creates train/test/predict step counters: unnamed, replica-aggregated scalars."""
  return (kwargs.get("name") is None and kwargs.get("trainable") is None and
          kwargs.get("aggregation") == tf.VariableAggregation.ONLY_FIRST_REPLICA)


class FunctionalModel:
  """`model(weights, x, training)` for a Keras model built by `build_fn`."""

  def __init__(self, build_fn: Callable[[], tf.keras.Model]):
    """
    Args:
      build_fn: builds the Keras model (the same architecture on every call). It is called once here
        to record the weights' order, shapes and initial values; initialization draws from TF's global
        seed, so seed first (`tf.keras.utils.set_random_seed`).
    """
    self._build_fn = build_fn
    created = []  # In creation order, which is the order __call__ hands tensors out in.

    def record(next_creator, **kwargs):
      v = next_creator(**kwargs)
      created.append(v)
      return v

    with tf.variable_creator_scope(record):
      model = build_fn()
    if model.non_trainable_variables:
      raise ValueError(f"{model.name} has non-trainable variables "
                       f"({[v.name for v in model.non_trainable_variables][:3]}); federated models "
                       f"must be batch-independent (GroupNorm, not BatchNorm)")
    # Keras models also create step counters (not weights); keep the model's own variables only.
    in_model = {id(v) for v in model.variables}
    created = [v for v in created if id(v) in in_model]
    if len(created) != len(model.variables):
      raise ValueError(f"{model.name} holds variables it did not create; shared variables are not "
                       f"supported")
    self.initial_weights: list[np.ndarray] = [v.numpy() for v in created]
    self.weight_specs = [tf.TensorSpec(v.shape, v.dtype) for v in created]
    self.names = [v.name for v in created]
    self.output_dim = int(model.output_shape[-1])

  def __call__(self, weights: Sequence[tf.Tensor], x: tf.Tensor, training: bool = True):
    if len(weights) != len(self.weight_specs):
      raise ValueError(f"expected {len(self.weight_specs)} weight tensors; got {len(weights)}")
    queue = list(weights)

    def use_given_tensor(next_creator, **kwargs):  # pylint: disable=unused-argument
      if _is_keras_counter(kwargs):
        value = kwargs["initial_value"]
        return tf.convert_to_tensor(value() if callable(value) else value)
      return queue.pop(0)

    with tf.variable_creator_scope(use_given_tensor):
      model = self._build_fn()
    if queue:
      raise ValueError(f"{len(queue)} weight tensors were not used by the model")
    return model(x, training=training)
