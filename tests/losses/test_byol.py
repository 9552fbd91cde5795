"""BYOL loss against an independent NumPy reference, hand-computed cases, and its stop-gradient."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl.ssl import byol


def reference_byol(p1, p2, t1, t2):
  """Eq. 2 per sample, ||p/|p| - t/|t|||^2, summed over the two view orders, looped over samples."""
  def term(p, t):
    total = 0.0
    for i in range(p.shape[0]):
      diff = p[i] / np.linalg.norm(p[i]) - t[i] / np.linalg.norm(t[i])
      total += diff @ diff
    return total / p.shape[0]
  return term(p1, t2) + term(p2, t1)


@pytest.mark.parametrize("n", [1, 2, 7])
def test_matches_numpy_reference(n):
  rng = np.random.default_rng(n)
  p1, p2, t1, t2 = (rng.normal(size=(n, 5)) for _ in range(4))
  np.testing.assert_allclose(byol.byol_loss(p1, p2, t1, t2).numpy(),
                             reference_byol(p1, p2, t1, t2), rtol=1e-6)


def test_view_order_matters_as_in_the_paper():
  # p1 regresses t2 and p2 regresses t1 (not their own view's targets). With t1 orthogonal to t2,
  # predictions equal to the other view's targets give 0; equal to their own view's, 2 + 2.
  t1, t2 = np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])
  np.testing.assert_allclose(byol.byol_loss(t2, t1, t1, t2).numpy(), 0.0, atol=1e-12)
  np.testing.assert_allclose(byol.byol_loss(t1, t2, t1, t2).numpy(), 4.0, rtol=1e-12)


@pytest.mark.parametrize("scale,want", [(3.0, 0.0), (-0.5, 8.0)])
def test_hand_computed_parallel_and_antiparallel(scale, want):
  # p = c t: cos = sign(c), so each term is 2 - 2 sign(c): 0 (parallel) or 4 (antiparallel).
  t1, t2 = np.array([[1.0, 2.0, -1.0]]), np.array([[0.5, 0.0, 2.0]])
  got = byol.byol_loss(scale * t2, scale * t1, t1, t2).numpy()
  np.testing.assert_allclose(got, want, atol=1e-12)


def test_hand_computed_orthogonal():
  # cos = 0: each term is 2, the sum 4, whatever the norms.
  t1, t2 = np.array([[2.0, 0.0], [0.0, 1.0]]), np.array([[0.0, 5.0], [3.0, 0.0]])
  p1, p2 = np.array([[7.0, 0.0], [0.0, 0.1]]), np.array([[0.0, 1.0], [4.0, 0.0]])
  np.testing.assert_allclose(byol.byol_loss(p1, p2, t1, t2).numpy(), 4.0, atol=1e-12)


def test_gradient_flows_to_predictions_not_targets():
  rng = np.random.default_rng(0)
  p1, p2, t1, t2 = (tf.constant(rng.normal(size=(4, 3))) for _ in range(4))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([p1, p2, t1, t2])
    loss = byol.byol_loss(p1, p2, t1, t2)
  for t in (t1, t2):
    grad = tape.gradient(loss, t)
    assert grad is None or not np.any(grad.numpy())
  for p in (p1, p2):
    assert np.abs(tape.gradient(loss, p).numpy()).max() > 1e-3


def test_zero_vector_is_finite():
  # A zero prediction or target normalizes to zero (cosine 0), so its term is exactly 2.
  p1 = tf.constant([[0.0, 0.0], [1.0, 0.0]])
  t2 = tf.constant([[1.0, 1.0], [0.0, 0.0]])
  p2 = t1 = tf.constant([[1.0, 0.0], [0.0, 1.0]])
  with tf.GradientTape() as tape:
    tape.watch(p1)
    loss = byol.byol_loss(p1, p2, t1, t2)
  assert np.isfinite(loss.numpy())
  np.testing.assert_allclose(loss.numpy(), 2.0, rtol=1e-6)  # Mean over rows of 2 + 0.
  assert np.all(np.isfinite(tape.gradient(loss, p1).numpy()))


def test_mismatched_shapes_raise():
  with pytest.raises(ValueError, match="batch size"):
    byol.byol_loss(np.ones((1, 3)), np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3)))
  with pytest.raises(ValueError, match="same dimension"):
    byol.byol_loss(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 4)))


def test_registered_as_an_ssl_method():
  from tff_ssl import ssl as ssl_lib
  method = ssl_lib.get("byol")
  assert method.predictor and method.ema_target and method.min_samples == 1
  assert method.hparams == ("target_decay", "predictor")
