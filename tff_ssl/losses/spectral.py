"""The spectral contrastive loss (HaoChen, Wei, Gaidon and Ma, NeurIPS 2021, eq. 5), FedSC's objective,
as a statistics loss.

    L(f) = -2 E_{x, x+}[f(x)^T f(x+)] + E_{x, x-}[(f(x)^T f(x-))^2]

over a batch of n positive pairs (f_i, g_i), the negatives being the other images' second views:

    L = -2/n sum_i f_i . g_i + 1/(n(n-1)) sum_{i != j} (f_i . g_j)^2
      = -2 <f . g> + (n <F^T F / n, G^T G / n>_F - <(f . g)^2>) / (n - 1)

since sum_{i,j} (f_i . g_j)^2 = tr((F^T F)(G^T G)). Every statistic is a mean over images: exact from
the statistics of a union of clients, whatever their sizes.
"""

from __future__ import annotations

import tensorflow as tf

from tff_ssl.losses.statistics import StatisticsLoss, Term


def _dot(f, g):
  return tf.reduce_sum(f * g, axis=1)


def loss_from_statistics(stats, count, hparams=None, eps: float = 0.0):
  """The spectral contrastive loss from the statistics (`STATISTICS`'s terms) of `count` images."""
  del hparams, eps  # No hyperparameters; no variance to floor.
  cross = tf.reduce_sum(stats["mean_ff"] * stats["mean_gg"], axis=[-2, -1])
  return -2.0 * stats["mean_dot"] + (count * cross - stats["mean_dot_sq"]) / (count - 1.0)


STATISTICS = StatisticsLoss(
    name="spectral",
    terms=(Term("mean_dot", _dot),
           Term("mean_ff", lambda f, g: f, outer=lambda f, g: f),
           Term("mean_gg", lambda f, g: g, outer=lambda f, g: g),
           Term("mean_dot_sq", lambda f, g: tf.square(_dot(f, g)))),
    loss_fn=loss_from_statistics,
    # |f.g|, (f.g)^2 <= 1 and |f f^T|, |g g^T| = 1 (f = g attains all four): 2.
    unit_bound=2.0,
    summary="the spectral contrastive loss (HaoChen et al., 2021), FedSC's objective")
