"""Optimizers for centralized training and evaluation, by name, with a cosine schedule."""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.optim.lars import LARS

OPTIMIZERS = {
    "adam": lambda lr: tf.keras.optimizers.Adam(lr),
    "sgd": lambda lr: tf.keras.optimizers.SGD(lr, momentum=0.9),
    "lars": lambda lr: LARS(lr, momentum=0.9),
}


def cosine_schedule(learning_rate: float, steps: int):
  """Cosine decay from `learning_rate` to 0 over `steps` steps."""
  if learning_rate <= 0:
    raise ValueError(f"learning rate must be > 0; got {learning_rate}")
  return tf.keras.optimizers.schedules.CosineDecay(learning_rate, max(1, steps))


def make_optimizer(name: str, learning_rate: float, steps: int) -> tf.keras.optimizers.Optimizer:
  """Optimizer `name` (one of OPTIMIZERS) with a cosine-decayed learning rate over `steps` steps."""
  if name not in OPTIMIZERS:
    raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
  return OPTIMIZERS[name](cosine_schedule(learning_rate, steps))
