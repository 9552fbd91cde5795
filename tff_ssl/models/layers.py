"""Normalization layers that do not depend on the batch: weight-standardized convolution, GroupNorm."""

from __future__ import annotations

import math

import tensorflow as tf

MAX_GROUPS = 32  # DCCO: GroupNorm with 32 groups (Sec. 4.1).


class WSConv2D(tf.keras.layers.Conv2D):
  """Conv2D with Weight Standardization (Qiao et al., 2019).

  Each output filter of the kernel is standardized to zero mean and unit variance over its
  (height, width, in_channels) entries before the convolution; the stored kernel is unconstrained.
  """

  def __init__(self, *args, ws_eps: float = 1e-5, **kwargs):
    super().__init__(*args, **kwargs)
    self.ws_eps = ws_eps

  def standardized_kernel(self, kernel: tf.Tensor) -> tf.Tensor:
    mean, var = tf.nn.moments(kernel, axes=[0, 1, 2], keepdims=True)
    return (kernel - mean) * tf.math.rsqrt(var + self.ws_eps)

  def convolution_op(self, inputs, kernel):
    return super().convolution_op(inputs, self.standardized_kernel(kernel))

  def get_config(self):
    return {**super().get_config(), "ws_eps": self.ws_eps}


def num_groups(channels: int, max_groups: int = MAX_GROUPS, min_group_size: int = 1) -> int:
  """gcd(channels, max_groups) (32 whenever it divides), halved until groups hold at least
  `min_group_size` channels."""
  g = math.gcd(channels, max_groups)
  while g > 1 and channels // g < min_group_size:
    g //= 2
  return g


def group_norm(channels: int, name: str | None = None,
               min_group_size: int = 1) -> tf.keras.layers.Layer:
  """GroupNorm over the last axis. On feature maps a one-channel group still normalizes over space;
  on vectors ([B, C], the MLP heads) it would zero everything, so heads ask for groups of >= 4."""
  return tf.keras.layers.GroupNormalization(
      groups=num_groups(channels, min_group_size=min_group_size), epsilon=1e-5, name=name)
