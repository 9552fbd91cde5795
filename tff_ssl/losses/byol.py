"""BYOL, the bootstrap-your-own-latent regression loss (Grill et al., 2020).

The online network's prediction q of one view regresses the target network's projection z' of the
other view; with both l2-normalized (eq. 2),

    L(q, z') = || q/||q|| - z'/||z'|| ||^2 = 2 - 2 cos(q, z'),

and the symmetrized loss swaps the views and sums the two terms: L^BYOL = L + L~ (Sec. 3.1). The
loss is a mean of per-sample terms with no within-batch interaction, so it is defined for N >= 1 and
a group of clients' losses are segment means of the same per-sample terms (`per_client.py`).
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


def byol_loss_per_sample(p1: tf.Tensor, p2: tf.Tensor, t1: tf.Tensor, t2: tf.Tensor) -> tf.Tensor:
  """[N] symmetrized BYOL terms (2 - 2 cos(p1_i, t2_i)) + (2 - 2 cos(p2_i, t1_i)); see byol_loss."""
  p1 = tf.convert_to_tensor(p1)
  p2, t1, t2 = (tf.convert_to_tensor(x, dtype=p1.dtype) for x in (p2, t1, t2))
  check_pairs(p1, t2)
  check_pairs(p2, t1)
  # The target network is updated by a moving average of the online weights, never by this loss.
  t1, t2 = tf.stop_gradient(t1), tf.stop_gradient(t2)
  return (2.0 - 2.0 * cosine_similarity(p1, t2)) + (2.0 - 2.0 * cosine_similarity(p2, t1))


def byol_loss(p1: tf.Tensor, p2: tf.Tensor, t1: tf.Tensor, t2: tf.Tensor) -> tf.Tensor:
  """Symmetrized BYOL loss (Grill et al., 2020, eq. 2 and L^BYOL = L + L~); a scalar in [0, 8].

  mean_i (2 - 2 cos(p1_i, t2_i)) + mean_i (2 - 2 cos(p2_i, t1_i)): view 1's prediction regresses
  view 2's target projection and vice versa. The targets pass through `tf.stop_gradient` here, so
  the loss differentiates only through the online predictions. Works for N >= 1.

  Args:
    p1: [N, d] online network predictions q_theta(z_theta) of view 1.
    p2: [N, d] online network predictions of view 2.
    t1: [N, d] target network projections z'_xi of view 1.
    t2: [N, d] target network projections of view 2.

  Returns:
    The scalar loss.
  """
  return tf.reduce_mean(byol_loss_per_sample(p1, p2, t1, t2))
