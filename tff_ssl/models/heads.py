"""MLP projector / predictor heads: Dense layers with a normalization + ReLU between hidden layers.

DCCO: "Weight standardization and group normalization with 32 groups are used at every layer except the
last projection layer" (Sec. 4.1): `norm="group"`, every head's default. `norm="batch"` uses batch
statistics instead (`BatchStatNormalization`: over the client's own batch, per view), the published
heads of BYOL, SimSiam, SimCLR and MoCo v3, where GroupNorm heads let BYOL and SimSiam solve their loss
without the encoder learning (DCCO's Appendix C). `output_norm` adds a non-affine batch normalization
after the last layer (SimSiam's and MoCo v3's projectors), whose bias it replaces. `unit_output`
scales each output row to unit L2 norm (`--projector_output=unit`). Sizes are the output widths of
each layer, e.g. [1024, 1024, 1024].
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tff_ssl.models.layers import BatchStatNormalization, Dense, group_norm

HEAD_NORMS = ("group", "batch", "none")

# GroupNorm over a vector normalizes within each group only: a group of one channel is always 0.
MIN_HEAD_GROUP_SIZE = 4


def build_mlp_head(input_dim: int, sizes: Sequence[int], *, name: str = "projector",
                   norm: str = "group", output_norm: bool = False,
                   unit_output: bool = False) -> tf.keras.Model:
  """An MLP [B, input_dim] -> [B, sizes[-1]]: hidden layers Dense-`norm`-ReLU ("none": Dense-ReLU),
  the last a Dense with a bias, or without one and followed by a non-affine batch normalization
  (`output_norm`, batch heads only); then, with `unit_output`, each row scaled to unit norm."""
  sizes = list(sizes)
  if not sizes or any(int(s) <= 0 for s in sizes):
    raise ValueError(f"head sizes must be a non-empty list of positive ints; got {sizes}")
  if norm not in HEAD_NORMS:
    raise ValueError(f"unknown head normalization {norm!r}; choose one of {list(HEAD_NORMS)}")
  if output_norm and norm != "batch":
    raise ValueError(f"output_norm is a batch normalization; the {name} has norm={norm!r}")
  inputs = tf.keras.Input(shape=(input_dim,), name=f"{name}_in")
  x = inputs
  for i, size in enumerate(sizes):
    last = i == len(sizes) - 1
    # A bias only where no normalization follows (it would subtract it again).
    bias = (not output_norm) if last else norm == "none"
    x = Dense(size, use_bias=bias, name=f"{name}_dense{i + 1}")(x)
    if not last:
      if norm == "group":
        x = group_norm(size, f"{name}_gn{i + 1}", min_group_size=MIN_HEAD_GROUP_SIZE)(x)
      elif norm == "batch":
        x = BatchStatNormalization(name=f"{name}_bn{i + 1}")(x)
      x = tf.keras.layers.ReLU(name=f"{name}_relu{i + 1}")(x)
  if output_norm:
    x = BatchStatNormalization(affine=False, name=f"{name}_bn_out")(x)
  if unit_output:
    # Keras' per-row L2 normalization: no weights, a per-image map, so a grouped round and a
    # centralized batch see the same rows.
    x = tf.keras.layers.UnitNormalization(axis=-1, name=f"{name}_unit")(x)
  return tf.keras.Model(inputs, x, name=name)
