"""MLP projector / predictor heads: Dense layers with GroupNorm + ReLU between hidden layers only.

DCCO: "Weight standardization and group normalization with 32 groups are used at every layer except the
last projection layer" (Sec. 4.1). Sizes are the output widths of each layer, e.g. [1024, 1024, 1024].
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tff_ssl.models.layers import group_norm

# GroupNorm over a vector normalizes within each group only: a group of one channel is always 0.
MIN_HEAD_GROUP_SIZE = 4


def build_mlp_head(input_dim: int, sizes: Sequence[int], *, name: str = "projector") -> tf.keras.Model:
  """An MLP [B, input_dim] -> [B, sizes[-1]]; no normalization or activation after the last layer."""
  sizes = list(sizes)
  if not sizes or any(int(s) <= 0 for s in sizes):
    raise ValueError(f"head sizes must be a non-empty list of positive ints; got {sizes}")
  inputs = tf.keras.Input(shape=(input_dim,), name=f"{name}_in")
  x = inputs
  for i, size in enumerate(sizes):
    last = i == len(sizes) - 1
    x = tf.keras.layers.Dense(size, use_bias=last, name=f"{name}_dense{i + 1}")(x)
    if not last:
      x = group_norm(size, f"{name}_gn{i + 1}", min_group_size=MIN_HEAD_GROUP_SIZE)(x)
      x = tf.keras.layers.ReLU(name=f"{name}_relu{i + 1}")(x)
  return tf.keras.Model(inputs, x, name=name)
