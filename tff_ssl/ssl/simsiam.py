"""SimSiam (Chen & He, 2021): the prediction of one view regresses the stop-gradient projection of the
other view, from the same (online) network: BYOL without a moving-average target.

    D(p, z) = - p/||p|| . z/||z||                                                      (eq. 1)
    L = 1/2 D(p1, stopgrad(z2)) + 1/2 D(p2, stopgrad(z1))                               (eq. 3)

Like BYOL it is a mean of per-sample terms with no within-batch interaction, so it is defined for
N >= 1 and a group of clients' losses are segment means of the same per-sample terms.
"""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.losses import per_client
from tff_ssl.losses.pairs import check_pairs, cosine_similarity
from tff_ssl.ssl.base import SSLMethod


def simsiam_loss_per_sample(p1: tf.Tensor, p2: tf.Tensor, z1: tf.Tensor,
                            z2: tf.Tensor) -> tf.Tensor:
  """[N] terms -0.5 cos(p1_i, z2_i) - 0.5 cos(p2_i, z1_i); see `simsiam_loss`."""
  p1 = tf.convert_to_tensor(p1)
  p2, z1, z2 = (tf.convert_to_tensor(x, dtype=p1.dtype) for x in (p2, z1, z2))
  check_pairs(p1, z2)
  check_pairs(p2, z1)
  # The stop-gradient is what keeps SimSiam from collapsing (Sec. 4.1); z_k still gets gradients
  # through p_k = h(z_k) in its own view's term.
  z1, z2 = tf.stop_gradient(z1), tf.stop_gradient(z2)
  return -0.5 * cosine_similarity(p1, z2) - 0.5 * cosine_similarity(p2, z1)


def simsiam_loss(p1: tf.Tensor, p2: tf.Tensor, z1: tf.Tensor, z2: tf.Tensor) -> tf.Tensor:
  """SimSiam loss (Chen & He, 2021, eq. 3); a scalar in [-1, 1], -1 at perfect alignment.

  0.5 D(p1, z2) + 0.5 D(p2, z1) with D(p, z) = -cos(p, stop_gradient(z)) averaged over the batch.
  The projections pass through `tf.stop_gradient` here. Works for N >= 1.

  Args:
    p1: [N, d] predictor outputs h(f(x1)) of view 1.
    p2: [N, d] predictor outputs of view 2.
    z1: [N, d] projections f(x1) of view 1.
    z2: [N, d] projections of view 2.

  Returns:
    The scalar loss.
  """
  return tf.reduce_mean(simsiam_loss_per_sample(p1, p2, z1, z2))


def simsiam_loss_per_client(p1: tf.Tensor, p2: tf.Tensor, z1: tf.Tensor, z2: tf.Tensor,
                            sizes: tf.Tensor) -> tf.Tensor:
  """[K] SimSiam losses (`simsiam_loss`, projections stop-gradiented) of clients whose rows of `p1`,
  `p2`, `z1`, `z2` have the given sizes; a one-sample client is fine."""
  return per_client.mean_per_client(simsiam_loss_per_sample(p1, p2, z1, z2), sizes)


METHOD = SSLMethod(
    name="simsiam",
    loss=lambda o, hp: simsiam_loss(o.p1, o.p2, o.z1, o.z2),
    per_client_loss=lambda o, sizes, hp: simsiam_loss_per_client(o.p1, o.p2, o.z1, o.z2, sizes),
    predictor=True, min_samples=1, hparams=("predictor",),
    # --head_norm=batch: SimSiam: BN on every projector layer, the output's without affine (He's
    # code: `BatchNorm1d(dim, affine=False)`); predictor Linear-BN-ReLU-Linear.
    batch_heads="hidden+output")
