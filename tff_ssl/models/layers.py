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


class GroupNormalization(tf.keras.layers.GroupNormalization):
  """Keras' GroupNormalization with plain moments when there is no mask: the same layer (weights,
  names, serialization: the class keeps Keras' name, so automatic layer names are unchanged) and the
  same function up to float round-off.

  Keras' `call` always builds a mask of ones the size of the input and takes weighted moments. Where the
  batch dimension is unknown when the graph is built (a TFF computation's `[None, ...]` client data)
  nothing folds that mask away, and the layer costs 1.7x as much (ResNet-14's forward pass 1.33x:
  0.35 s vs 0.26 s for 1,024 images on 2 cores; `BUILD-notes.md`, "Grouped simulation").
  """

  def call(self, inputs, mask=None):
    rank = inputs.shape.rank
    if mask is not None or self.axis % rank != rank - 1:
      return super().call(inputs, mask)
    channels = inputs.shape[-1]
    groups = self.groups
    shape = tf.shape(inputs)
    grouped = tf.reshape(inputs, tf.concat([shape[:-1], [groups, channels // groups]], axis=0))
    # Reduce over everything but the batch and the group axes.
    axes = list(range(1, rank - 1)) + [rank]
    mean, variance = tf.nn.moments(grouped, axes=axes, keepdims=True)
    param_shape = [1] * (rank - 1) + [groups, channels // groups]
    gamma = tf.reshape(self.gamma, param_shape) if self.scale else None
    beta = tf.reshape(self.beta, param_shape) if self.center else None
    out = tf.nn.batch_normalization(grouped, mean=mean, variance=variance, offset=beta,
                                    scale=gamma, variance_epsilon=self.epsilon)
    return tf.reshape(out, shape)


def group_norm(channels: int, name: str | None = None,
               min_group_size: int = 1) -> tf.keras.layers.Layer:
  """GroupNorm over the last axis. On feature maps a one-channel group still normalizes over space;
  on vectors ([B, C], the MLP heads) it would zero everything, so heads ask for groups of >= 4."""
  return GroupNormalization(
      groups=num_groups(channels, min_group_size=min_group_size), epsilon=1e-5, name=name)
