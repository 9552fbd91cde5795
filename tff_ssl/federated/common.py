"""Pieces shared by the federated SSL processes: client input types, views, server state, optimizers."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.data.augment import AugmentConfig, two_views
from tff_ssl.federated.functional import FunctionalModel


def client_input_type(image_shape: Sequence[int]) -> tff.StructType:
  """One client's round input: its images and their dataset indices (which key the augmentations)."""
  return tff.StructType([
      ("images", tff.TensorType(np.uint8, [None] + list(image_shape))),
      ("ids", tff.TensorType(np.int64, [None])),
  ])


def client_inputs(images: np.ndarray, ids: np.ndarray) -> dict[str, np.ndarray]:
  """The value of `client_input_type` for one client."""
  return {"images": np.asarray(images, np.uint8), "ids": np.asarray(ids, np.int64)}


def weights_type(model: FunctionalModel) -> tff.StructType:
  """The model's weights as a TFF type: a list of tensors (a Python list inside TF computations, as
  TFF's own aggregators, e.g. `clipping_factory`, need: they `tf.nest` over the value)."""
  return tff.StructWithPythonType(
      [tff.TensorType(s.dtype.as_numpy_dtype, s.shape) for s in model.weight_specs], list)


SEED_TYPE = tff.TensorType(np.int64, [2])


def views(data, seed, augment: AugmentConfig):
  """The two views of a client's images for the round's seed, keyed by example id."""
  return two_views(data["images"] if isinstance(data, dict) else data.images, seed, augment,
                   data["ids"] if isinstance(data, dict) else data.ids)


def encode_views(model: FunctionalModel, weights, v1, v2):
  """Projections (F, G) of both views in one forward pass (GroupNorm is per-sample: exact)."""
  return encode_outputs(model, weights, v1, v2)[0]


def encode_outputs(model: FunctionalModel, weights, v1, v2) -> list[tuple[tf.Tensor, tf.Tensor]]:
  """(view 1, view 2) of each of the model's outputs (projections, then predictions if any), from
  one forward pass over both views."""
  out = model(list(weights), tf.concat([v1, v2], axis=0), training=True)
  return [tuple(tf.split(o, 2, axis=0)) for o in (out if isinstance(out, (list, tuple)) else [out])]


def num_examples(data) -> tf.Tensor:
  images = data["images"] if isinstance(data, dict) else data.images
  return tf.cast(tf.shape(images)[0], tf.float32)


@dataclasses.dataclass
class ServerState:
  """What the server carries between rounds; every field is a (nested) array structure."""

  weights: list[np.ndarray]
  optimizer_state: Any
  aggregator_state: Any
  round_num: int


def round_seed(seed: int, round_num: int) -> np.ndarray:
  return np.array([seed, round_num], np.int64)


def build_server_update(optimizer: tff.learning.optimizers.Optimizer, model: FunctionalModel):
  """(weights, optimizer_state, update) -> (weights, optimizer_state): the server's optimizer step,
  with the aggregated client update taken as the gradient (TFF's finalizer convention)."""

  @tf.function
  def update(weights, state, delta):
    state, new_weights = optimizer.next(state, tuple(weights), tuple(delta))
    return list(new_weights), state

  def initialize():
    return optimizer.initialize(tuple(model.weight_specs))

  return initialize, update


CLIENT_OPTIMIZERS = ("sgd", "sgdm")


def client_optimizer(name: str, learning_rate: float) -> tff.learning.optimizers.Optimizer:
  """The clients' local optimizer: plain gradient descent ("sgd", the papers' choice, and what
  DCCO's equivalence needs) or SGD with momentum 0.9 ("sgdm"), restarted every round."""
  if name not in CLIENT_OPTIMIZERS:
    raise ValueError(f"unknown client optimizer {name!r}; choose one of {list(CLIENT_OPTIMIZERS)}")
  return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate,
                                            momentum=0.9 if name == "sgdm" else None)


def local_training(weights, steps: int, optimizer: str, learning_rate: float, loss_of,
                   after_step=None, weight_decay: float = 0.0):
  """`steps` client optimizer steps from `weights` on `loss_of(current_weights, step)`.

  `after_step(current_weights)` runs after each step (BYOL's target update). `weight_decay` adds
  weight_decay * w to every gradient (coupled L2, as PyTorch's SGD does).

  Returns (Delta = weights - trained weights, the first step's loss, the mean loss over the steps):
  what a client sends back, its loss at the broadcast model, and its mean training loss.
  """
  initial = list(weights)
  current = list(weights)
  local_opt = client_optimizer(optimizer, learning_rate)
  opt_state = local_opt.initialize(tuple(tf.TensorSpec(w.shape, w.dtype) for w in current))
  step_losses = []
  for step in range(steps):
    with tf.GradientTape() as tape:
      tape.watch(current)
      loss = loss_of(current, step)
    grads = tape.gradient(loss, current)
    if weight_decay:
      grads = [g + weight_decay * w for g, w in zip(grads, current)]
    opt_state, current = local_opt.next(opt_state, tuple(current), tuple(grads))
    current = list(current)
    step_losses.append(loss)
    if after_step is not None:
      after_step(current)
  return ([a - b for a, b in zip(initial, current)], step_losses[0],
          tf.add_n(step_losses) / float(steps))


def check_client_training(local_steps: int, optimizer: str, learning_rate: float) -> None:
  """Validates the client-side training settings every process shares."""
  if local_steps < 1:
    raise ValueError(f"local_steps must be >= 1; got {local_steps}")
  if optimizer not in CLIENT_OPTIMIZERS:
    raise ValueError(f"unknown client_optimizer {optimizer!r}; choose one of "
                     f"{list(CLIENT_OPTIMIZERS)}")
  if not learning_rate > 0:
    raise ValueError(f"client_learning_rate must be > 0; got {learning_rate}")


SERVER_OPTIMIZERS = {
    "sgd": lambda lr: tff.learning.optimizers.build_sgdm(learning_rate=lr),
    "sgdm": lambda lr: tff.learning.optimizers.build_sgdm(learning_rate=lr, momentum=0.9),
    "adam": lambda lr: tff.learning.optimizers.build_adam(learning_rate=lr),
    "lars": lambda lr: _lars(lr),
}


def _lars(lr):
  from tff_ssl.federated.lars import LARSOptimizer  # pylint: disable=g-import-not-at-top
  return LARSOptimizer(lr)


class ServerLoop:
  """The server's part shared by every process: initial state, and the optimizer step that closes a
  round with the aggregated update."""

  def __init__(self, model: FunctionalModel, server_optimizer, aggregator=None):
    self.model = model
    self._aggregator = aggregator
    self._init_optimizer, self._server_update = build_server_update(server_optimizer, model)

  def initialize(self) -> ServerState:
    return ServerState(weights=[w.copy() for w in self.model.initial_weights],
                       optimizer_state=self._init_optimizer(),
                       aggregator_state=self._aggregator.initialize() if self._aggregator else (),
                       round_num=0)

  def finish_round(self, state: ServerState, update, loss, num_clients: int,
                   aggregator_state=()) -> tuple[ServerState, dict]:
    weights, opt_state = self._server_update(state.weights, state.optimizer_state, list(update))
    new_state = ServerState(weights=[np.asarray(w) for w in weights], optimizer_state=opt_state,
                            aggregator_state=aggregator_state, round_num=state.round_num + 1)
    return new_state, {"loss": float(loss), "clients": num_clients}
