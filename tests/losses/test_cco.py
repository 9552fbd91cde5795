"""CCO loss: statistics, loss from statistics, and the union-of-batches fact DCCO rests on."""

import numpy as np
import pytest
import tensorflow as tf

import types

from tff_ssl import losses
from tff_ssl import ssl as ssl_lib


def reference_cco(f, g, lambd):
  """Direct NumPy computation of eq. 1-2: standardize columns, correlate, sum loops."""
  fs = (f - f.mean(0)) / f.std(0)
  gs = (g - g.mean(0)) / g.std(0)
  n, d = f.shape
  c = fs.T @ gs / n
  loss = 0.0
  for i in range(d):
    loss += (1 - c[i, i]) ** 2
    for j in range(d):
      if j != i:
        loss += lambd * c[i, j] ** 2 / (d - 1)
  return loss


def random_encodings(n, d, seed):
  rng = np.random.default_rng(seed)
  f = rng.normal(size=(n, d))
  g = 0.7 * f + 0.5 * rng.normal(size=(n, d)) + 1.5  # Correlated, with an offset mean.
  return f, g


def test_loss_from_statistics_equals_direct_computation():
  f, g = random_encodings(64, 8, seed=0)
  got = losses.cco_loss_from_statistics(losses.encoding_statistics(f, g), lambd=20.0, eps=0.0)
  np.testing.assert_allclose(got.numpy(), reference_cco(f, g, 20.0), rtol=1e-10)


def test_float32_loss_matches_reference_within_eps():
  f, g = random_encodings(128, 16, seed=1)
  got = losses.cco_loss(tf.constant(f, tf.float32), tf.constant(g, tf.float32), lambd=5.0)
  np.testing.assert_allclose(got.numpy(), reference_cco(f, g, 5.0), rtol=1e-4)


def test_statistics_of_union_are_size_weighted_mean_of_parts():
  f, g = random_encodings(10, 6, seed=2)
  sizes = [1, 3, 6]  # A one-sample part included: its statistics are still exact.
  bounds = np.cumsum([0] + sizes)
  parts = [losses.encoding_statistics(f[a:b], g[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
  merged = losses.weighted_mean_statistics(parts, sizes)
  union = losses.encoding_statistics(f, g)
  for got, want in zip(merged, union):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)
  np.testing.assert_allclose(
      losses.cco_loss_from_statistics(merged).numpy(),
      losses.cco_loss_from_statistics(union).numpy(), rtol=1e-12)
  # Unweighted averaging of the parts is NOT the union (the weights matter).
  unweighted = losses.weighted_mean_statistics(parts, [1, 1, 1])
  assert not np.allclose(unweighted.mean_fg.numpy(), union.mean_fg.numpy())


def test_hand_computed_values():
  # F = G with orthogonal, standardized columns: C = I, so the loss is 0.
  h = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1]], np.float64)
  assert abs(float(losses.cco_loss(h, h, lambd=20.0, eps=0.0))) < 1e-12
  # Two identical columns: C = [[1, 1], [1, 1]] -> 0 + 20 * (1 + 1) / 1 = 40.
  col = np.array([[1.0], [2.0], [3.0], [5.0]])
  same = np.concatenate([col, col], axis=1)
  np.testing.assert_allclose(float(losses.cco_loss(same, same, lambd=20.0, eps=0.0)), 40.0,
                             rtol=1e-12)
  # Anti-correlated views: C_ii = -1 on both dims, off-diagonal -1: 2 * 4 + 20 * 2 = 48.
  np.testing.assert_allclose(float(losses.cco_loss(same, -same, lambd=20.0, eps=0.0)), 48.0,
                             rtol=1e-12)


def test_within_batch_loss_on_one_sample_raises():
  f = np.ones((1, 4), np.float32)
  with pytest.raises(ValueError, match="at least 2 samples"):
    losses.cco_loss(f, f)
  # Statistics of one sample are fine: DCCO clients may hold a single image.
  stats = losses.encoding_statistics(f, f)
  assert stats.mean_fg.shape == (4, 4)


def test_mismatched_dimensions_raise():
  with pytest.raises(ValueError, match="same dimension"):
    losses.encoding_statistics(np.zeros((4, 3)), np.zeros((4, 5)))


def test_gradient_of_loss_from_statistics_flows_to_encodings():
  f, g = random_encodings(16, 4, seed=3)
  f = tf.Variable(f)
  with tf.GradientTape() as tape:
    loss = losses.cco_loss(f, tf.constant(g))
  grad = tape.gradient(loss, f)
  assert grad is not None and np.all(np.isfinite(grad.numpy())) and np.abs(grad.numpy()).max() > 0


def test_ssl_registry_losses_are_the_losses_of_this_package():
  f, g = random_encodings(8, 4, seed=4)
  hp = ssl_lib.get("cco")
  cfg = types.SimpleNamespace(cco_lambda=3.0, temperature=0.2)
  np.testing.assert_allclose(
      ssl_lib.get("cco").loss(ssl_lib.Outputs(tf.constant(f), tf.constant(g)), cfg).numpy(),
      losses.cco_loss(f, g, lambd=3.0).numpy(), rtol=1e-6)
  np.testing.assert_allclose(
      ssl_lib.get("simclr").loss(ssl_lib.Outputs(tf.constant(f), tf.constant(g)), cfg).numpy(),
      ssl_lib.simclr.nt_xent_loss(f, g, temperature=0.2).numpy(), rtol=1e-6)
  assert hp.hparams == ("cco_lambda",)
  with pytest.raises(ValueError, match="unknown SSL method 'nt_xent'"):
    ssl_lib.get("nt_xent")
