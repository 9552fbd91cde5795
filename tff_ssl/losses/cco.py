"""Cross-correlation optimization (CCO) loss, split into encoding statistics and loss-from-statistics.

DCCO (Vemulapalli et al., 2023, eq. 1-2) rests on one fact: the CCO loss is a function of five batch
statistics of the two encodings F and G, and the statistics of a union of batches are the size-weighted
means of the parts' statistics. Keeping the two steps separate pure functions lets a federated round
average the statistics (phase 1) and every client evaluate the loss on the aggregate (phase 2).

    L = sum_i (1 - C_ii)^2 + lambda * sum_i 1/(d-1) sum_{j != i} C_ij^2                      (eq. 1)
    C_ij = (<F_i G_j> - <F_i><G_j>) / (sqrt(<F_i^2> - <F_i>^2) sqrt(<G_j^2> - <G_j>^2))      (eq. 2)

Within one client (`--ssl=cco` on FedAvg-style clients and centralized) the loss is computed from the
batch's correlation matrix (`cco_loss`) and, for a group of clients concatenated in one batched pass,
from n x n Gram matrices (`cco_loss_per_client`): with F^, G^ the per-dimension standardized
encodings (n x d), C = F^T G^ / n, so sum_ij C_ij^2 = <F^ F^T, G^ G^T>_F / n^2 (n^2 d instead of n d^2
work, for n << d). CCO is the Barlow Twins loss with its off-diagonal weight written as
lambda / (d - 1): Barlow Twins' lambda_BT is `cco_lambda / (d - 1)` (lambda_BT = 5e-3 at d = 128 is
cco_lambda = 0.635).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import tensorflow as tf

from tff_ssl.config_fields import Field
from tff_ssl.losses import per_client
from tff_ssl.losses.statistics import StatisticsLoss, Term, check_batch, check_encodings

DEFAULT_LAMBDA = 20.0  # The paper's trade-off (Sec. 4.1).
DEFAULT_EPS = 1e-6  # Added to variances; keeps a constant encoding dimension finite.


class EncodingStatistics(NamedTuple):
  """Batch means of two encodings F, G (each [N, d]); enough to evaluate the CCO loss."""

  mean_f: tf.Tensor  # <F_i>, [d]
  mean_f2: tf.Tensor  # <F_i^2>, [d]
  mean_g: tf.Tensor  # <G_j>, [d]
  mean_g2: tf.Tensor  # <G_j^2>, [d]
  mean_fg: tf.Tensor  # <F_i G_j>, [d, d]


def encoding_statistics(f: tf.Tensor, g: tf.Tensor) -> EncodingStatistics:
  """The five CCO statistics of encodings `f` and `g` ([N, d] each) over their N rows.

  Valid for N = 1 (a one-image client): its statistics are meaningful once averaged with others.
  """
  f = tf.convert_to_tensor(f)
  g = tf.convert_to_tensor(g, dtype=f.dtype)
  check_encodings(f, g)
  n = tf.cast(tf.shape(f)[0], f.dtype)
  return EncodingStatistics(
      mean_f=tf.reduce_mean(f, axis=0),
      mean_f2=tf.reduce_mean(tf.square(f), axis=0),
      mean_g=tf.reduce_mean(g, axis=0),
      mean_g2=tf.reduce_mean(tf.square(g), axis=0),
      mean_fg=tf.matmul(f, g, transpose_a=True) / n,
  )


def weighted_mean_statistics(stats: Sequence[EncodingStatistics],
                             weights: Sequence[float]) -> EncodingStatistics:
  """The weighted mean of several batches' statistics: the union's statistics when weights are N_k."""
  if len(stats) != len(weights) or not stats:
    raise ValueError(f"need one weight per statistics tuple; got {len(stats)} tuples, "
                     f"{len(weights)} weights")
  w = tf.convert_to_tensor(weights, dtype=stats[0].mean_f.dtype)
  w = w / tf.reduce_sum(w)
  return EncodingStatistics(*[
      tf.add_n([w[k] * s[field] for k, s in enumerate(stats)])
      for field in range(len(EncodingStatistics._fields))
  ])


def cross_correlation(stats: EncodingStatistics, eps: float = DEFAULT_EPS) -> tf.Tensor:
  """The d x d correlation matrix C of eq. 2 from the statistics (of any leading shape: [..., d, d])."""
  var_f = tf.maximum(stats.mean_f2 - tf.square(stats.mean_f), 0.0)
  var_g = tf.maximum(stats.mean_g2 - tf.square(stats.mean_g), 0.0)
  cov = stats.mean_fg - stats.mean_f[..., :, None] * stats.mean_g[..., None, :]
  return cov / (tf.sqrt(var_f + eps)[..., :, None] * tf.sqrt(var_g + eps)[..., None, :])


def cco_loss_from_statistics(stats: EncodingStatistics,
                             lambd: float = DEFAULT_LAMBDA,
                             eps: float = DEFAULT_EPS) -> tf.Tensor:
  """CCO loss (eq. 1) from the five statistics; a scalar (one per leading index)."""
  c = cross_correlation(stats, eps)
  d = tf.shape(c)[-1]
  diag = tf.linalg.diag_part(c)
  on_diag = tf.reduce_sum(tf.square(1.0 - diag), axis=-1)
  off_diag = tf.reduce_sum(tf.square(c), axis=[-2, -1]) - tf.reduce_sum(tf.square(diag), axis=-1)
  return on_diag + lambd * off_diag / tf.cast(d - 1, c.dtype)


def cco_loss(f: tf.Tensor, g: tf.Tensor, lambd: float = DEFAULT_LAMBDA,
             eps: float = DEFAULT_EPS) -> tf.Tensor:
  """Within-batch CCO loss of encodings `f`, `g` ([N, d]); needs N >= 2 (correlations of one sample
  are undefined)."""
  f = check_batch(tf.convert_to_tensor(f), "CCO")
  return cco_loss_from_statistics(encoding_statistics(f, g), lambd, eps)


def cco_loss_per_client(f: tf.Tensor, g: tf.Tensor, sizes: tf.Tensor,
                        lambd: float = DEFAULT_LAMBDA,
                        eps: float = DEFAULT_EPS) -> tf.Tensor:
  """[K] within-client CCO losses (eq. 1) of clients whose rows of `f`, `g` have the given sizes."""
  fp, mask = per_client.pad_by_client(tf.convert_to_tensor(f), sizes)
  gp, _ = per_client.pad_by_client(tf.convert_to_tensor(g, fp.dtype), sizes)
  n = tf.reduce_sum(mask, axis=1)[:, None]  # [K, 1]
  w = mask[:, :, None]

  def standardized(x):  # Same one-pass moments as `cross_correlation`.
    mean = tf.reduce_sum(w * x, axis=1) / n
    var = tf.maximum(tf.reduce_sum(w * tf.square(x), axis=1) / n - tf.square(mean), 0.0)
    return w * (x - mean[:, None, :]) / tf.sqrt(var + eps)[:, None, :]

  fh, gh = standardized(fp), standardized(gp)
  d = tf.cast(tf.shape(fp)[2], fp.dtype)
  diag = tf.reduce_sum(fh * gh, axis=1) / n  # [K, d]: C_ii.
  gram_f = tf.matmul(fh, fh, transpose_b=True)
  gram_g = tf.matmul(gh, gh, transpose_b=True)
  all_sq = tf.reduce_sum(gram_f * gram_g, axis=[1, 2]) / tf.square(n[:, 0])  # sum_ij C_ij^2.
  on_diag = tf.reduce_sum(tf.square(1.0 - diag), axis=1)
  off_diag = all_sq - tf.reduce_sum(tf.square(diag), axis=1)
  return on_diag + lambd * off_diag / (d - 1.0)


def _loss(stats, count, hparams=None, eps: float = DEFAULT_EPS):
  del count  # Correlations are scale-free: no 1/(N-1).
  return cco_loss_from_statistics(EncodingStatistics(**stats),
                                  getattr(hparams, "cco_lambda", DEFAULT_LAMBDA), eps)


# CCO as a statistics loss: the five statistics of `encoding_statistics`, the same ops in the same
# order (the same numbers to the digit).
STATISTICS = StatisticsLoss(
    name="cco",
    terms=(Term("mean_f", lambda f, g: f), Term("mean_f2", lambda f, g: tf.square(f)),
           Term("mean_g", lambda f, g: g), Term("mean_g2", lambda f, g: tf.square(g)),
           Term("mean_fg", lambda f, g: f, outer=lambda f, g: g)),
    loss_fn=_loss, eps=DEFAULT_EPS,
    # |f|, |f^2|, |g|, |g^2| <= 1 and |f g^T| = |f| |g| = 1 (f = g = e_1 attains all five): sqrt(5).
    unit_bound=5.0 ** 0.5,
    fields=(Field("cco_lambda", DEFAULT_LAMBDA, "CCO off-diagonal weight (CCO methods only).",
                  lower=0),),
    summary="CCO, the Barlow Twins cross-correlation loss (DCCO, eq. 1-2)",
    batch_form=lambda f, g, hp: cco_loss(f, g, lambd=hp.cco_lambda),
    per_client_form=lambda f, g, sizes, hp: cco_loss_per_client(f, g, sizes, lambd=hp.cco_lambda))
