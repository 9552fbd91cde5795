"""FedFoA's feature-correlation terms against hand-checked cases and an independent NumPy reference."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl.losses import feature_correlation as fc

# Z = P D: P a 90-degree rotation about the third axis, D = diag(1, 2, 3).
P = np.array([[0., -1., 0.], [1., 0., 0.], [0., 0., 1.]], np.float32)
D = np.diag([1., 2., 3.]).astype(np.float32)
Z = P @ D  # [[0, -2, 0], [1, 0, 0], [0, 0, 3]]


def test_procrustes_hand_checked_3x3():
  # R = I: the Q closest to Z is Z's polar factor, P (Z = P D, D positive diagonal); the residual
  # ||P D - P|| = ||D - I|| = sqrt(0 + 1 + 4).
  q = fc.procrustes(tf.constant(Z), tf.eye(3)).numpy()
  np.testing.assert_allclose(q, P, atol=1e-6)
  err = fc.reconstruction_error(tf.constant(Z), tf.eye(3)).numpy()
  assert err == pytest.approx(np.sqrt(5.0), abs=1e-5)
  assert fc.reconstruction_error(tf.constant(Z), tf.eye(3), "fro_squared").numpy() == (
      pytest.approx(5.0, abs=1e-5))
  # R = D: Z = P D exactly, so Q* = P and the residual is 0.
  np.testing.assert_allclose(fc.procrustes(tf.constant(Z), tf.constant(D)).numpy(), P, atol=1e-6)
  assert fc.reconstruction_error(tf.constant(Z), tf.constant(D)).numpy() == pytest.approx(0, abs=1e-5)


def test_correlation_r_is_upper_with_nonnegative_diagonal_and_reconstructs():
  rng = np.random.default_rng(0)
  z = rng.normal(size=(12, 4)).astype(np.float32)
  r = fc.correlation_r(tf.constant(z)).numpy()
  assert np.all(np.diag(r) >= 0) and np.allclose(np.tril(r, -1), 0)
  # Z^T Z = R^T R (Q has orthonormal columns); with a non-negative diagonal R is the Cholesky factor.
  np.testing.assert_allclose(r, np.linalg.cholesky(z.T.astype(np.float64) @ z).T, rtol=1e-4,
                             atol=1e-4)
  with pytest.raises(ValueError, match="m >= n"):
    fc.correlation_r(tf.zeros([3, 4]))


def test_term_is_zero_when_z_is_an_orthogonal_q_times_r():
  rng = np.random.default_rng(1)
  q, _ = np.linalg.qr(rng.normal(size=(10, 4)))
  r = np.triu(rng.normal(size=(4, 4))) + 3 * np.eye(4)
  z = (q @ r).astype(np.float32)
  bank = tf.constant(np.stack([r, 2 * r]).astype(np.float32))
  errors = fc.reconstruction_error(tf.constant(z), bank).numpy()
  assert errors[0] == pytest.approx(0.0, abs=1e-4) and errors[1] > 1.0


def _reference(z, r, squared=False):
  """min_Q ||Z - Q R||_F^2 = ||Z||^2 + ||R||^2 - 2 ||R Z^T||_* (NumPy, float64)."""
  z, r = z.astype(np.float64), r.astype(np.float64)
  sq = (z ** 2).sum() + (r ** 2).sum() - 2 * np.linalg.svd(r @ z.T, compute_uv=False).sum()
  return sq if squared else np.sqrt(max(sq, 0.0))


def test_term_and_its_gradient_against_the_closed_form():
  rng = np.random.default_rng(2)
  z = rng.normal(size=(9, 3)).astype(np.float32)
  bank = np.stack([np.triu(rng.normal(size=(3, 3))) for _ in range(3)]).astype(np.float32)
  for norm in fc.NORMS:
    squared = norm == "fro_squared"
    zt = tf.constant(z)
    with tf.GradientTape() as tape:
      tape.watch(zt)
      errors = fc.reconstruction_error(zt, tf.constant(bank), norm)
      total = tf.reduce_sum(errors)
    grad = tape.gradient(total, zt).numpy()
    for j in range(3):
      assert errors.numpy()[j] == pytest.approx(_reference(z, bank[j], squared), rel=1e-4)
    # Central differences of the closed form: the held-fixed Q* gives the exact gradient.
    eps, numeric = 1e-4, np.zeros_like(z, np.float64)
    for idx in np.ndindex(z.shape):
      up, down = z.astype(np.float64), z.astype(np.float64)
      up[idx] += eps
      down[idx] -= eps
      numeric[idx] = sum(_reference(up, b, squared) - _reference(down, b, squared)
                         for b in bank) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-3)


def test_partners_by_trace_and_the_summed_term():
  rng = np.random.default_rng(3)
  z = rng.normal(size=(8, 2)).astype(np.float32)
  own = fc.correlation_r(tf.constant(z)).numpy()
  t = np.trace(own)
  bank = np.stack([np.diag([t, 1.0]), np.diag([t / 4, 0.1]), np.diag([t, t]),
                   np.diag([t, t])]).astype(np.float32)  # Traces t + 1, small, 2t, 2t.
  valid = tf.constant([True, True, True, False])
  chosen = fc.partners(tf.constant(own), tf.constant(bank), valid).numpy()
  assert chosen.tolist() == [True, False, True, False]
  assert fc.partners(tf.constant(own), tf.constant(bank), valid, "all").numpy().tolist() == [
      True, True, True, False]
  total, count = fc.alignment_loss(tf.constant(z), tf.constant(bank), valid)
  assert float(count) == 2
  assert float(total) == pytest.approx(_reference(z, bank[0]) + _reference(z, bank[2]), rel=1e-4)
