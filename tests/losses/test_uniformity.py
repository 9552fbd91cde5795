"""FedU²'s FUR (tff_ssl/losses/uniformity.py) against a NumPy transcription of its equations, in
float64; and what it measures: collapsed projections score far above ones spread over the sphere."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl.losses import uniformity


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _log(t, x):
  """The sphere's log map, point by point: the tangent vector at t towards x, its length the angle."""
  out = []
  for row in x:
    c = float(np.clip(row @ t, -1.0, 1.0))
    v = row - c * t
    norm = np.linalg.norm(v)
    out.append(np.zeros_like(t) if norm == 0 else np.arccos(c) * v / norm)
  return np.array(out)


def _sw(x, y, directions):
  return np.mean([np.mean((np.sort(x @ th) - np.sort(y @ th)) ** 2) for th in directions])


def _fur(z, refs, tangents, directions):
  z, u, t = _unit(z), _unit(refs), _unit(tangents)
  return np.mean([_sw(_log(t[k], u), _log(t[k], z), directions[k]) for k in range(len(t))])


def test_fur_equals_the_numpy_equations():
  rng = np.random.default_rng(0)
  z, refs = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
  tangents, directions = rng.normal(size=(3, 5)), rng.normal(size=(3, 4, 5))
  got = uniformity.fur_loss(tf.constant(z), refs, tangents, directions)
  np.testing.assert_allclose(float(got), _fur(z, refs, tangents, directions), rtol=1e-10)


def test_the_log_map_has_the_geodesic_length_and_a_finite_gradient_at_its_base():
  t = tf.constant(_unit(np.array([1.0, 2.0, 2.0])))
  x = tf.constant(_unit(np.array([[2.0, -1.0, 0.5], [1.0, 2.0, 2.0]])))
  log = uniformity.sphere_log(t, x)
  np.testing.assert_allclose(np.linalg.norm(log[0]), np.arccos(float(x.numpy()[0] @ t.numpy())), rtol=1e-9)
  np.testing.assert_allclose(log[1], np.zeros(3), atol=1e-5)  # x = t: no way to go.
  with tf.GradientTape() as tape:
    tape.watch(x)
    value = tf.reduce_sum(uniformity.sphere_log(t, x))
  assert np.all(np.isfinite(tape.gradient(value, x).numpy()))


def test_collapsed_projections_score_far_above_spread_ones():
  seed = tf.constant([3, 4], tf.int64)
  draws = uniformity.draws(seed, 256, 8)
  rng = np.random.default_rng(1)
  spread = rng.normal(size=(256, 8))  # Uniform on the sphere once normalized.
  collapsed = np.ones((256, 8)) + 0.05 * rng.normal(size=(256, 8))
  low, high = (float(uniformity.fur_loss(tf.constant(v, tf.float32), *draws))
               for v in (spread, collapsed))
  assert high > 20 * low


@pytest.mark.parametrize("n", [4, 9])
def test_the_draws_follow_the_seed(n):
  a = uniformity.draws(tf.constant([1, 2], tf.int64), n, 3)
  b = uniformity.draws(tf.constant([1, 2], tf.int64), n, 3)
  c = uniformity.draws(tf.constant([1, 3], tf.int64), n, 3)
  assert [x.shape.as_list() for x in a] == [[n, 3], [6, 3], [6, 6, 3]]
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not np.allclose(a[0], c[0])
