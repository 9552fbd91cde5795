"""SimSiam loss against an independent NumPy reference, hand-computed cases, and its stop-gradient."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl.ssl import simsiam


def reference_simsiam(p1, p2, z1, z2):
  """Eq. 1 and 3: D(p, z) = -p/|p| . z/|z| averaged over samples; L = D(p1, z2)/2 + D(p2, z1)/2."""
  def d(p, z):
    total = 0.0
    for i in range(p.shape[0]):
      total += -(p[i] @ z[i]) / (np.linalg.norm(p[i]) * np.linalg.norm(z[i]))
    return total / p.shape[0]
  return 0.5 * d(p1, z2) + 0.5 * d(p2, z1)


@pytest.mark.parametrize("n", [1, 2, 7])
def test_matches_numpy_reference(n):
  rng = np.random.default_rng(n)
  p1, p2, z1, z2 = (rng.normal(size=(n, 5)) for _ in range(4))
  np.testing.assert_allclose(simsiam.simsiam_loss(p1, p2, z1, z2).numpy(),
                             reference_simsiam(p1, p2, z1, z2), rtol=1e-6)


@pytest.mark.parametrize("scale,want", [(3.0, -1.0), (-0.5, 1.0)])
def test_hand_computed_parallel_and_antiparallel(scale, want):
  # p = c z of the other view: cos = sign(c), so L = -sign(c).
  z1, z2 = np.array([[1.0, 2.0, -1.0]]), np.array([[0.5, 0.0, 2.0]])
  got = simsiam.simsiam_loss(scale * z2, scale * z1, z1, z2).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-12)


def test_hand_computed_orthogonal_and_mixed():
  z1, z2 = np.array([[2.0, 0.0]]), np.array([[0.0, 5.0]])
  # Both predictions orthogonal to their targets: 0.
  np.testing.assert_allclose(simsiam.simsiam_loss(z1, z2, z1, z2).numpy(), 0.0, atol=1e-12)
  # p1 parallel to z2 (D = -1), p2 orthogonal to z1 (D = 0): L = -0.5.
  np.testing.assert_allclose(simsiam.simsiam_loss(z2, z2, z1, z2).numpy(), -0.5, rtol=1e-12)


def test_gradient_flows_to_predictions_not_projections():
  rng = np.random.default_rng(0)
  p1, p2, z1, z2 = (tf.constant(rng.normal(size=(4, 3))) for _ in range(4))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([p1, p2, z1, z2])
    loss = simsiam.simsiam_loss(p1, p2, z1, z2)
  for z in (z1, z2):
    grad = tape.gradient(loss, z)
    assert grad is None or not np.any(grad.numpy())
  for p in (p1, p2):
    assert np.abs(tape.gradient(loss, p).numpy()).max() > 1e-3


def test_zero_vector_is_finite():
  # A zero prediction or projection normalizes to zero (cosine 0).
  p1 = tf.constant([[0.0, 0.0]])
  p2 = z1 = tf.constant([[1.0, 0.0]])
  z2 = tf.constant([[0.0, 0.0]])
  with tf.GradientTape() as tape:
    tape.watch([p1, p2])
    loss = simsiam.simsiam_loss(p1, p2, z1, z2)
  np.testing.assert_allclose(loss.numpy(), -0.5, rtol=1e-6)  # 0.5 * 0 + 0.5 * (-1).
  for grad in tape.gradient(loss, [p1, p2]):
    assert np.all(np.isfinite(grad.numpy()))


def test_mismatched_shapes_raise():
  with pytest.raises(ValueError, match="batch size"):
    simsiam.simsiam_loss(np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2)), np.ones((1, 2)))


def test_the_registry_entry_wires_each_view_to_the_other_views_target():
  # The loss `--ssl=simsiam` trains with: p1 against z2 and p2 against z1 (Eq. 3), not p1 against z1.
  import types
  from tff_ssl import ssl as ssl_lib
  method = ssl_lib.get("simsiam")
  rng = np.random.default_rng(5)
  p1, p2, z1, z2 = (rng.normal(size=(4, 6)) for _ in range(4))
  outputs = types.SimpleNamespace(p1=p1, p2=p2, z1=z1, z2=z2)
  np.testing.assert_allclose(method.loss(outputs, ssl_lib.Hparams()).numpy(),
                             reference_simsiam(p1, p2, z1, z2), rtol=1e-6)
  assert abs(reference_simsiam(p1, p2, z1, z2) - reference_simsiam(p1, p2, z2, z1)) > 1e-3
  assert method.predictor and not method.ema_target
