"""VICReg (Bardes, Ponce and LeCun, ICLR 2022, eq. 1-6 and Algorithm 1) as a statistics loss.

    l = lambda s(Z, Z') + mu [v(Z) + v(Z')] + nu [c(Z) + c(Z')]
    s(Z, Z') = mean_i ||z_i - z'_i||^2 / d                      invariance
    v(Z) = 1/d sum_j max(0, gamma - sqrt(Var(z^j) + eps))       variance  (gamma = 1, eps = 1e-4)
    c(Z) = 1/d sum_{i != j} C(Z)_ij^2                          covariance
    C(Z) = 1/(n-1) sum_i (z_i - zbar)(z_i - zbar)^T

lambda = mu = 25, nu = 1 (the paper's Sec. 4.1). The invariance term is divided by d as in the paper's
Algorithm 1 (`F.mse_loss`, the mean over images and dimensions), whose coefficients these are; the
text's eq. 5 writes the sum over dimensions. Var and C use n - 1, as Algorithm 1 does: `count`.

Every term is a mean over images, so the loss is exact from the statistics of a union of clients:
<z>, <z z^T> of each view and <||z - z'||^2>.
"""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.losses.statistics import StatisticsLoss, Term

DEFAULT_INVARIANCE = 25.0  # lambda
DEFAULT_VARIANCE = 25.0  # mu
DEFAULT_COVARIANCE = 1.0  # nu
GAMMA = 1.0  # The target standard deviation.
EPS = 1e-4  # Added to the variance under the square root.


def _covariance(mean, second, count):
  """The n - 1 covariance [..., d, d] from <z> [..., d] and <z z^T> [..., d, d] over `count`."""
  n = tf.reshape(count, tf.concat([tf.shape(count), [1, 1]], axis=0))
  return n / (n - 1.0) * (second - mean[..., :, None] * mean[..., None, :])


def _variance_and_covariance_terms(mean, second, count, eps):
  cov = _covariance(mean, second, count)
  var = tf.linalg.diag_part(cov)
  d = tf.cast(tf.shape(var)[-1], var.dtype)
  std = tf.sqrt(tf.maximum(var, 0.0) + eps)
  v = tf.reduce_mean(tf.nn.relu(GAMMA - std), axis=-1)
  c = (tf.reduce_sum(tf.square(cov), axis=[-2, -1]) - tf.reduce_sum(tf.square(var), axis=-1)) / d
  return v, c


def loss_from_statistics(stats, count, hparams=None, eps: float = EPS):
  """VICReg from the statistics (`STATISTICS`'s terms) of `count` images."""
  lambd = getattr(hparams, "vicreg_invariance", DEFAULT_INVARIANCE)
  mu = getattr(hparams, "vicreg_variance", DEFAULT_VARIANCE)
  nu = getattr(hparams, "vicreg_covariance", DEFAULT_COVARIANCE)
  d = tf.cast(tf.shape(stats["mean_f"])[-1], stats["mean_f"].dtype)
  v_f, c_f = _variance_and_covariance_terms(stats["mean_f"], stats["mean_ff"], count, eps)
  v_g, c_g = _variance_and_covariance_terms(stats["mean_g"], stats["mean_gg"], count, eps)
  s = stats["mean_distance"] / d
  return lambd * s + mu * (v_f + v_g) + nu * (c_f + c_g)


STATISTICS = StatisticsLoss(
    name="vicreg",
    terms=(Term("mean_f", lambda f, g: f),
           Term("mean_g", lambda f, g: g),
           Term("mean_ff", lambda f, g: f, outer=lambda f, g: f),
           Term("mean_gg", lambda f, g: g, outer=lambda f, g: g),
           Term("mean_distance", lambda f, g: tf.reduce_sum(tf.square(f - g), axis=1))),
    loss_fn=loss_from_statistics,
    # |f|, |g|, |f f^T|, |g g^T| = 1 and ||f - g||^2 <= 4 (g = -f attains it): sqrt(4 + 16).
    unit_bound=20.0 ** 0.5,
    fields=(Field("vicreg_invariance", DEFAULT_INVARIANCE, "VICReg: the invariance term's "
                  "weight (lambda).", lower=0),
            Field("vicreg_variance", DEFAULT_VARIANCE, "VICReg: the variance term's weight (mu).",
                  lower=0),
            Field("vicreg_covariance", DEFAULT_COVARIANCE, "VICReg: the covariance term's weight "
                  "(nu).", lower=0)),
    eps=EPS,
    summary="VICReg: invariance, variance and covariance terms (Bardes et al., 2022)")
