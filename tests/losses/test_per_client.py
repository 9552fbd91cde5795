"""Per-client losses from one concatenated batch equal the single-client losses, values and gradients."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import losses
from tff_ssl.losses import per_client

SIZES = [2, 5, 3, 16]


def concatenated(seed, dtype, d=24):
  rng = np.random.default_rng(seed)
  n = sum(SIZES)
  f = rng.normal(size=(n, d))
  g = 0.6 * f + 0.4 * rng.normal(size=(n, d)) + 0.3
  return tf.constant(f, dtype), tf.constant(g, dtype)


def split(x):
  return tf.split(x, SIZES, axis=0)


def test_pad_by_client_layout():
  x = tf.reshape(tf.range(6, dtype=tf.float32), [3, 2])
  padded, mask = per_client.pad_by_client(x, [1, 2])
  np.testing.assert_array_equal(padded.numpy(), [[[0, 1], [0, 0]], [[2, 3], [4, 5]]])
  np.testing.assert_array_equal(mask.numpy(), [[1, 0], [1, 1]])


@pytest.mark.parametrize("name,single,kwargs", [
    ("cco", losses.cco_loss, {"lambd": 7.0}),
    ("nt_xent", losses.nt_xent_loss, {"temperature": 0.2}),
])
# float64 checks the algebra (Gram form, masking) tightly; float32 is what training runs. Two-sample
# clients make CCO ill-conditioned (every correlation is +-1), hence the float32 tolerance.
@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-9), (tf.float32, 2e-4)])
def test_per_client_loss_equals_single_client_loss(name, single, kwargs, dtype, tol):
  f, g = concatenated(0, dtype)
  fn = per_client.PER_CLIENT_LOSSES[name](**kwargs)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([f, g])
    got = fn(f, g, tf.constant(SIZES))
    weighted = tf.reduce_sum(got * tf.constant(SIZES, dtype))
    want = [single(a, b, **kwargs) for a, b in zip(split(f), split(g))]
    want_weighted = tf.add_n([n * l for n, l in zip(SIZES, want)])
  np.testing.assert_allclose(got.numpy(), [w.numpy() for w in want], rtol=tol)
  for x in (f, g):
    a, b = tape.gradient(weighted, x).numpy(), tape.gradient(want_weighted, x).numpy()
    assert np.abs(a - b).max() <= tol * np.abs(b).max()


def test_cco_per_client_gram_form_with_more_samples_than_dimensions():
  rng = np.random.default_rng(3)
  f = tf.constant(rng.normal(size=(40, 4)), tf.float32)
  g = tf.constant(rng.normal(size=(40, 4)), tf.float32)
  got = per_client.cco_loss_per_client(f, g, [30, 10], lambd=3.0)
  want = [losses.cco_loss(f[:30], g[:30], lambd=3.0), losses.cco_loss(f[30:], g[30:], lambd=3.0)]
  np.testing.assert_allclose(got.numpy(), [w.numpy() for w in want], rtol=1e-5)
