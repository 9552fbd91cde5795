"""FedFoA's feature-correlation terms (Liu et al., "Feature Correlation-guided Knowledge Transfer for
Federated Self-supervised Learning"), as pure functions of tensors.

    Z = Q R           a batch's features Z (m x n, m >= n), thin QR: Q (m x n) orthonormal columns,
                      R (n x n) upper triangular, the "feature-correlation matrix"; tr(R) measures the
                      features' independence (paper, Sec. 3.2)
    Q* = V U^T        where U S V^T = SVD(R_j Z^T): the orthogonal Procrustes solution of
                      min_{Q^T Q = I} ||Z - Q R_j|| (Eq. 5-6, Lemma 1)
    l_A(Z, R_j) = ||Z - Q* R_j||                                                      (Eq. 7)

Readings of what the paper leaves open (each alternative is an option):

* The sign of QR. A QR factorization is unique only once R's diagonal is fixed non-negative; TF's
  Householder QR does not fix it, and the paper's trace test needs it (a negative diagonal would make
  an independent feature lower the trace). `correlation_r` flips the rows of R (and Q's columns) with a
  negative diagonal.
* The norm. Lemma 1's proof minimizes tr((QR - Z)(QR - Z)^T), the squared Frobenius norm, and Q* is
  optimal for it (not for the spectral norm, which the subscript 2 of Eq. 5 could also mean); Eq. 7 is
  written unsquared. Default `norm="fro"`: ||.||_F; `"fro_squared"`: ||.||_F^2.
* The gradient through Q*. Q* minimizes the residual over a set that does not depend on Z, so (the
  envelope theorem) the gradient of min_Q ||Z - Q R_j|| with respect to Z is the gradient at Q = Q*
  held fixed: `tf.stop_gradient(Q*)` gives the exact gradient of Eq. 7 without differentiating an SVD
  (whose gradient is unstable at repeated singular values).
* Which j. Algorithm 1 (lines 16-23) sums the term over every other client j whose bank entry has a
  larger trace than the client's current R, tr(R_j) > tr(R_{t,b}^i): `select="trace"` (default).
  `select="all"` sums over every valid entry.
* Closed form, used as the tests' independent reference: min_Q ||Z - Q R||_F^2
  = ||Z||_F^2 + ||R||_F^2 - 2 ||R Z^T||_* (the nuclear norm: the sum of singular values).
"""

from __future__ import annotations

import tensorflow as tf

NORMS = ("fro", "fro_squared")
SELECTIONS = ("trace", "all")


def _check(name: str, value: str, choices) -> None:
  if value not in choices:
    raise ValueError(f"{name} {value!r} is not one of {list(choices)}")


def correlation_r(z: tf.Tensor) -> tf.Tensor:
  """R (n x n, upper triangular, non-negative diagonal) of the thin QR of features `z` (m x n,
  m >= n)."""
  m, n = z.shape[-2], z.shape[-1]
  if m is not None and n is not None and m < n:
    raise ValueError(f"FedFoA factorizes a batch's m x n features with m >= n; got m = {m} < n = {n} "
                     f"(use batches of at least {n} images or a smaller projection)")
  _, r = tf.linalg.qr(z, full_matrices=False)
  sign = tf.where(tf.linalg.diag_part(r) < 0, -1.0, 1.0)
  return r * sign[..., :, None]


def procrustes(z: tf.Tensor, r: tf.Tensor) -> tf.Tensor:
  """Q* (m x n) = V U^T, U S V^T = SVD(R Z^T): the Q with Q^T Q = I closest to Z = Q R. Batched over
  leading axes of `r` ([..., n, n]) against one `z` (m x n)."""
  _, u, v = tf.linalg.svd(tf.linalg.matmul(r, z, transpose_b=True), full_matrices=False)
  return tf.linalg.matmul(v, u, transpose_b=True)


def _safe_sqrt(x: tf.Tensor) -> tf.Tensor:
  """sqrt(x) with a zero (not NaN) gradient at x = 0."""
  positive = x > 0
  return tf.where(positive, tf.sqrt(tf.where(positive, x, 1.0)), 0.0)


def reconstruction_error(z: tf.Tensor, r: tf.Tensor, norm: str = "fro") -> tf.Tensor:
  """l_A(Z, R) = ||Z - Q* R|| (Eq. 7) for each R of `r` ([..., n, n]); Q* held fixed (see the module
  docstring), so the gradient is exact."""
  _check("norm", norm, NORMS)
  q = tf.stop_gradient(procrustes(tf.stop_gradient(z), r))
  squared = tf.reduce_sum(tf.square(z - tf.linalg.matmul(q, r)), axis=[-2, -1])
  return squared if norm == "fro_squared" else _safe_sqrt(squared)


def partners(own_r: tf.Tensor, bank: tf.Tensor, valid: tf.Tensor, select: str = "trace") -> tf.Tensor:
  """Which bank entries (bank: [K, n, n]; valid: [K] bool) a client with current R `own_r` aligns to:
  valid ones, and with `select="trace"` only those of larger trace (Algorithm 1, line 19)."""
  _check("select", select, SELECTIONS)
  if select == "all":
    return valid
  return tf.logical_and(valid, tf.linalg.trace(bank) > tf.linalg.trace(own_r))


def alignment_loss(z: tf.Tensor, bank: tf.Tensor, valid: tf.Tensor, norm: str = "fro",
                   select: str = "trace") -> tuple[tf.Tensor, tf.Tensor]:
  """sum_j l_A(Z, R_j) over the partners j (`partners`) in the bank; and how many there were."""
  chosen = partners(tf.stop_gradient(correlation_r(z)), bank, valid, select)
  errors = reconstruction_error(z, bank, norm)
  return (tf.reduce_sum(tf.where(chosen, errors, 0.0)),
          tf.reduce_sum(tf.cast(chosen, tf.float32)))
