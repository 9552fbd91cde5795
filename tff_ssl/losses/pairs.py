"""What the losses of paired rows share: the row-by-row check, the cosine, unit vectors.

A prediction batch and the projection batch it regresses (BYOL, SimSiam), or queries and their keys
(MoCo, MoCo v3), line up row by row; the SSL methods of `tff_ssl.ssl` check and normalize them here.
"""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.losses import statistics

# tf.math.l2_normalize's floor on the squared norm: a zero vector normalizes to zero (cosine 0, a
# finite loss and gradient) instead of dividing by zero.
NORMALIZE_EPS = 1e-12


def check_pairs(online: tf.Tensor, target: tf.Tensor) -> None:
  """Raises unless a prediction batch and the projection batch it regresses line up row by row."""
  statistics.check_encodings(online, target)
  n, m = online.shape[0], target.shape[0]
  # Elementwise products would silently broadcast a 1-row batch against an N-row one.
  if n is not None and m is not None and n != m:
    raise ValueError(f"predictions and projections must have the same batch size; got {n} and {m}")


def cosine_similarity(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
  """[N] cosine of row i of `x` with row i of `y` ([N, d] each); 0 where either row is zero."""
  x = tf.math.l2_normalize(x, axis=1, epsilon=NORMALIZE_EPS)
  y = tf.math.l2_normalize(y, axis=1, epsilon=NORMALIZE_EPS)
  return tf.reduce_sum(x * y, axis=1)


def unit(x: tf.Tensor) -> tf.Tensor:
  """Vectors (the last axis) scaled to unit L2 norm (zero vectors stay zero)."""
  return tf.math.l2_normalize(x, axis=-1, epsilon=NORMALIZE_EPS)
