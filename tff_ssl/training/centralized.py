"""Centralized SSL pretraining of encoder + projector: the upper-bound baseline of every table.

DCCO's centralized CCO: batch 512, Adam with cosine decay from 5e-3 (CIFAR-100, Appendix B). Each step
draws a batch from a seeded per-epoch permutation, makes two BYOL views keyed by (seed, step, example
index), encodes both views in one forward pass (GroupNorm is per-sample, so this is exact; batch
heads normalize each view over its own images) and applies the SSL method's loss.

Every SSL method of `tff_ssl.ssl` trains here, with what it carries across steps, as in its paper:
a predictor head (BYOL, SimSiam, MoCo v3); a target (momentum) encoder + projector, started as a copy
of the online ones and moved after each step to `target_decay` * target + (1 - target_decay) * online
(BYOL, MoCo v2, MoCo v3), whose projections of both views are the loss's t1, t2 (no gradient); and
MoCo's queue of `moco_queue` negative keys, zeros at the start, into which each step's t2 enters.
The gradient reaches the online encoder, projector and predictor only.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf

from tff_ssl import optim
from tff_ssl import runtime
from tff_ssl import ssl as ssl_lib
from tff_ssl.config_fields import Field
from tff_ssl.data.augment import AugmentConfig, two_views
from tff_ssl.method import CENTRALIZED_FIELDS, Method
from tff_ssl.models import SSLModel
from tff_ssl.models.layers import batch_segments

# SSL methods centralized pretraining trains with: all of them.
CENTRALIZED_SSL = tuple(ssl_lib.SSL_METHODS)
DEFAULT_TARGET_DECAY = ssl_lib.byol.DEFAULT_TARGET_DECAY

# The fields centralized pretraining (and the supervised baseline) read: their one check.
STEPS = Field("steps", 300, "Pretraining steps.", lower=1)
BATCH_SIZE = Field("batch_size", 256, "Pretraining batch size (>= 2: the SSL losses compare images "
                   "within a batch).", lower=2)
OPTIMIZER = Field("optimizer", "adam", "Pretraining optimizer (tff_ssl.optim).",
                  choices=lambda: optim.names("centralized"))
LEARNING_RATE = Field("learning_rate", 2e-3, "Peak pretraining learning rate (cosine decay, after "
                      "the warm-up of --warmup_fraction).", lower=0, open_lower=True)
WEIGHT_DECAY = Field("weight_decay", 0.0, "Pretraining weight decay: decoupled, w -= lr * "
                     "weight_decay * w a step (AdamW's; MoCo v3's ViTs: 0.1).", lower=0)


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """Centralized pretraining hyperparameters (defaults: DCCO's centralized CCO on CIFAR-100)."""

  steps: int
  batch_size: int = 512
  ssl: str = "cco"  # A `tff_ssl.ssl` method of CENTRALIZED_SSL.
  hparams: ssl_lib.Hparams = ssl_lib.Hparams()  # The SSL method's (cco_lambda, temperature, ...).
  optimizer: str = "adam"
  learning_rate: float = 5e-3
  weight_decay: float = 0.0
  warmup_fraction: float = 0.0  # Linear warm-up over this fraction of the steps, then cosine.
  augment: AugmentConfig = AugmentConfig.dcco_cifar()
  seed: int = 0

  def __post_init__(self):
    for spec in (STEPS, BATCH_SIZE, OPTIMIZER, LEARNING_RATE, WEIGHT_DECAY, optim.WARMUP_FRACTION):
      spec.check(getattr(self, spec.name))
    if self.ssl not in CENTRALIZED_SSL:
      raise ValueError(f"centralized pretraining trains with ssl in {list(CENTRALIZED_SSL)}; got "
                       f"{self.ssl!r}")

  @property
  def method(self) -> ssl_lib.SSLMethod:
    return ssl_lib.get(self.ssl)

  def loss_fn(self) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """(z1, z2) -> the SSL method's loss with this config's hyperparameters (a method whose loss
    reads nothing but the projections: cco, simclr)."""
    method = self.method
    if method.predictor or method.ema_target:
      raise ValueError(f"ssl={self.ssl!r} needs a predictor or a target network, not only z1, z2; "
                       f"train it with `pretrain`")
    return lambda z1, z2: method.loss(ssl_lib.Outputs(z1, z2), self.hparams)


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
                    optimizer: tf.keras.optimizers.Optimizer, target: SSLModel | None = None,
                    queue: tf.Variable | None = None):
  """A compiled step (images uint8 [B,H,W,C], example ids [B], step) -> loss.

  `target`: the method's target network (encoder + projector, updated in place after the step);
  `queue`: MoCo's negative keys (a variable, updated in place). Both are required where the SSL
  method has them (`pretrain` makes them)."""
  method = config.method
  if method.predictor and model.predictor is None:
    raise ValueError(f"ssl={config.ssl!r} needs a predictor head on the model")
  if method.ema_target != (target is not None) or method.queue != (queue is not None):
    raise ValueError(f"ssl={config.ssl!r}: pass a target network exactly when it has one "
                     f"({method.ema_target}) and a queue exactly when it has one ({method.queue})")
  if target is not None:
    online_weights, target_weights = model.projection_variables, target.projection_variables
    if [w.shape for w in online_weights] != [w.shape for w in target_weights]:
      raise ValueError("the target network's weights do not match the online encoder + projector")
  decay = config.hparams.target_decay

  @tf.function
  def train_step(images, example_ids, step):
    v1, v2 = two_views(images, tf.stack([tf.constant(config.seed, tf.int64), step]),
                       config.augment, example_ids)
    views = tf.concat([v1, v2], axis=0)
    with tf.GradientTape() as tape:
      with batch_segments(2):  # Batch-statistics heads normalize each view over its own images.
        z = model.project(views, training=True)
        p = model.predict(z, training=True) if method.predictor else None
        t = tf.stop_gradient(target.project(views, training=True)) if target is not None else None
      z1, z2 = tf.split(z, 2, axis=0)
      p1, p2 = tf.split(p, 2, axis=0) if p is not None else (None, None)
      t1, t2 = tf.split(t, 2, axis=0) if t is not None else (None, None)
      loss = method.loss(ssl_lib.Outputs(z1, z2, p1, p2, t1, t2, queue), config.hparams)
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    if target is not None:
      for target_weight, online_weight in zip(target_weights, online_weights):
        target_weight.assign(decay * target_weight + (1.0 - decay) * online_weight)
    if queue is not None:
      queue.assign(ssl_lib.moco.enqueue(queue, t2))
    return loss

  return train_step


def target_network(model: SSLModel, build: Callable[[], SSLModel]) -> SSLModel:
  """A target network for `model`: `build()`'s encoder + projector with `model`'s weights."""
  target = build()
  for target_weight, online_weight in zip(target.projection_variables, model.projection_variables):
    target_weight.assign(online_weight)
  return SSLModel(target.encoder, target.projector)


def pretrain(model: SSLModel, images: np.ndarray, config: PretrainConfig, *,
             on_step: Callable[[int, float], None] | None = None,
             build: Callable[[], SSLModel] | None = None) -> list[float]:
  """Trains `model` in place on uint8 `images` [N, H, W, C]; returns the loss of every step.

  `on_step(step, loss)` is called after each step (progress bars, logging). `build`: makes a model
  of `model`'s architecture, for the target network of a method that has one.
  """
  method = config.method
  target = None
  if method.ema_target:
    if build is None:
      raise ValueError(f"ssl={config.ssl!r} has a target network: pass `build`, a builder of the "
                       f"model's architecture")
    target = target_network(model, build)
  queue = None
  if method.queue:
    dim = model.projector.output_shape[-1]
    queue = tf.Variable(tf.zeros([config.hparams.moco_queue, dim]), trainable=False, name="moco_queue")
  optimizer = optim.make_optimizer(config.optimizer, config.learning_rate, config.steps,
                                   config.weight_decay, config.warmup_fraction)
  train_step = make_train_step(model, config, optimizer, target, queue)
  batches = batch_indices(images.shape[0], config.batch_size, config.seed)
  history = []
  for step in range(config.steps):
    runtime.raise_if_interrupted()
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
      hparams=ssl_lib.hparams_of(config), optimizer=config.optimizer,
      learning_rate=config.learning_rate, weight_decay=config.weight_decay,
      warmup_fraction=config.warmup_fraction, augment=config.augment_config(), seed=config.seed)


METHOD = Method(
    name="centralized", kind="centralized", fields=CENTRALIZED_FIELDS, ssl=CENTRALIZED_SSL,
    validate=pretrain_config,
    summary="SSL pretraining on the pooled training data: the federated methods' upper bound.")
