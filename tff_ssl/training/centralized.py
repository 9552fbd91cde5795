"""Centralized SSL pretraining of encoder + projector: the upper-bound baseline of every table.

DCCO's centralized CCO: batch 512, Adam with cosine decay from 5e-3 (CIFAR-100, Appendix B). Each step
draws a batch from a seeded per-epoch permutation, makes two BYOL views keyed by (seed, step, example
index), encodes both views in one forward pass (GroupNorm is per-sample, so this is exact) and applies
the within-batch loss.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf

from tff_ssl import losses as losses_lib
from tff_ssl import optim
from tff_ssl import ssl as ssl_lib
from tff_ssl.data.augment import AugmentConfig, two_views
from tff_ssl.method import CENTRALIZED_FIELDS, Method
from tff_ssl.models import SSLModel
from tff_ssl.models.layers import batch_segments

# SSL methods centralized pretraining trains with: within-batch losses of the projections (no
# predictor head, no target network).
CENTRALIZED_SSL = tuple(name for name, m in ssl_lib.SSL_METHODS.items()
                        if not m.predictor and not m.ema_target)


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """Centralized pretraining hyperparameters (defaults: DCCO's centralized CCO on CIFAR-100)."""

  steps: int
  batch_size: int = 512
  ssl: str = "cco"  # A `tff_ssl.ssl` method of CENTRALIZED_SSL.
  cco_lambda: float = losses_lib.cco.DEFAULT_LAMBDA
  temperature: float = losses_lib.ntxent.DEFAULT_TEMPERATURE
  optimizer: str = "adam"
  learning_rate: float = 5e-3
  augment: AugmentConfig = AugmentConfig.dcco_cifar()
  seed: int = 0

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"steps must be >= 1; got {self.steps}")
    if self.batch_size < 2:
      raise ValueError(f"batch_size must be >= 2 for a within-batch SSL loss; got {self.batch_size}")
    if self.ssl not in CENTRALIZED_SSL:
      raise ValueError(f"centralized pretraining trains with ssl in {list(CENTRALIZED_SSL)}; got "
                       f"{self.ssl!r}")
    if self.optimizer not in optim.OPTIMIZERS:
      raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of "
                       f"{sorted(optim.OPTIMIZERS)}")

  def loss_fn(self) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """(z1, z2) -> the SSL method's loss with this config's hyperparameters."""
    method = ssl_lib.get(self.ssl)
    return lambda z1, z2: method.loss(ssl_lib.Outputs(z1, z2), self)


def batch_indices(num_examples: int, batch_size: int, seed: int) -> Iterator[np.ndarray]:
  """Endless batches of example indices: a fresh seeded permutation each epoch, remainder dropped."""
  if batch_size > num_examples:
    raise ValueError(f"batch_size {batch_size} exceeds the {num_examples} training examples")
  epoch = 0
  while True:
    perm = np.random.default_rng([seed, epoch]).permutation(num_examples)
    for start in range(0, num_examples - batch_size + 1, batch_size):
      yield perm[start:start + batch_size]
    epoch += 1


def make_train_step(model: SSLModel, config: PretrainConfig,
                    optimizer: tf.keras.optimizers.Optimizer):
  """A compiled step (images uint8 [B,H,W,C], example ids [B], step) -> loss."""
  loss_fn = config.loss_fn()

  @tf.function
  def train_step(images, example_ids, step):
    v1, v2 = two_views(images, tf.stack([tf.constant(config.seed, tf.int64), step]),
                       config.augment, example_ids)
    with tf.GradientTape() as tape:
      with batch_segments(2):  # Batch-statistics heads normalize each view over its own images.
        z = model.project(tf.concat([v1, v2], axis=0), training=True)
      z1, z2 = tf.split(z, 2, axis=0)
      loss = loss_fn(z1, z2)
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  return train_step


def pretrain(model: SSLModel, images: np.ndarray, config: PretrainConfig, *,
             on_step: Callable[[int, float], None] | None = None) -> list[float]:
  """Trains `model` in place on uint8 `images` [N, H, W, C]; returns the loss of every step.

  `on_step(step, loss)` is called after each step (progress bars, logging).
  """
  optimizer = optim.make_optimizer(config.optimizer, config.learning_rate, config.steps)
  train_step = make_train_step(model, config, optimizer)
  batches = batch_indices(images.shape[0], config.batch_size, config.seed)
  history = []
  for step in range(config.steps):
    idx = next(batches)
    loss = float(train_step(tf.constant(images[idx]), tf.constant(idx, tf.int64),
                            tf.constant(step, tf.int64)))
    if not np.isfinite(loss):
      raise FloatingPointError(f"pretraining loss became {loss} at step {step}; lower the learning "
                               f"rate (now {config.learning_rate})")
    history.append(loss)
    if on_step is not None:
      on_step(step, loss)
  return history


def pretrain_config(config) -> PretrainConfig:
  """The `PretrainConfig` of an `ExperimentConfig` (validating it)."""
  return PretrainConfig(
      steps=config.steps, batch_size=config.batch_size, ssl=config.ssl,
      cco_lambda=config.cco_lambda, temperature=config.temperature, optimizer=config.optimizer,
      learning_rate=config.learning_rate, augment=config.augment_config(), seed=config.seed)


METHOD = Method(
    name="centralized", kind="centralized", fields=CENTRALIZED_FIELDS, ssl=CENTRALIZED_SSL,
    validate=pretrain_config,
    summary="SSL pretraining on the pooled training data: the federated methods' upper bound.")
