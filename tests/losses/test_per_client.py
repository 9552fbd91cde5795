"""Per-client losses from one concatenated batch equal the single-client losses, values and gradients."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import losses
from tff_ssl.losses import per_client
from tff_ssl.ssl import byol, simclr, simsiam

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
    ("nt_xent", simclr.nt_xent_loss, {"temperature": 0.2}),
])
# float64 checks the algebra (Gram form, masking) tightly; float32 is what training runs. Two-sample
# clients make CCO ill-conditioned (every correlation is +-1), hence the float32 tolerance.
@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-9), (tf.float32, 2e-4)])
def test_per_client_loss_equals_single_client_loss(name, single, kwargs, dtype, tol):
  f, g = concatenated(0, dtype)
  fn = {"cco": lambda f, g, sizes: losses.cco.cco_loss_per_client(f, g, sizes, **kwargs),
        "nt_xent": lambda f, g, sizes: simclr.nt_xent_loss_per_client(f, g, sizes, **kwargs),
        }[name]
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
  got = losses.cco.cco_loss_per_client(f, g, [30, 10], lambd=3.0)
  want = [losses.cco_loss(f[:30], g[:30], lambd=3.0), losses.cco_loss(f[30:], g[30:], lambd=3.0)]
  np.testing.assert_allclose(got.numpy(), [w.numpy() for w in want], rtol=1e-5)


PREDICTION = {"byol": byol.byol_loss_per_client, "simsiam": simsiam.simsiam_loss_per_client}
PREDICTION_SIZES = [1, 3, 5]  # Unequal, with a one-sample client.


@pytest.mark.parametrize("name,single", [("byol", byol.byol_loss),
                                         ("simsiam", simsiam.simsiam_loss)])
# float64 checks the segment means tightly; float32 is what training runs.
@pytest.mark.parametrize("dtype,tol", [(tf.float64, 1e-6), (tf.float32, 1e-5)])
def test_prediction_loss_per_client_equals_single_client_loss(name, single, dtype, tol):
  rng = np.random.default_rng(7)
  n = sum(PREDICTION_SIZES)
  p1, p2, t1, t2 = (tf.constant(rng.normal(size=(n, 6)), dtype) for _ in range(4))
  fn = PREDICTION[name]
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([p1, p2, t1, t2])
    got = fn(p1, p2, t1, t2, tf.constant(PREDICTION_SIZES))
    weighted = tf.reduce_sum(got * tf.constant(PREDICTION_SIZES, dtype))
    parts = [tf.split(x, PREDICTION_SIZES, axis=0) for x in (p1, p2, t1, t2)]
    want = [single(*client) for client in zip(*parts)]
    want_weighted = tf.add_n([k * l for k, l in zip(PREDICTION_SIZES, want)])
  assert got.shape == (len(PREDICTION_SIZES),)
  np.testing.assert_allclose(got.numpy(), [w.numpy() for w in want], rtol=tol)
  for x in (p1, p2):
    a, b = tape.gradient(weighted, x).numpy(), tape.gradient(want_weighted, x).numpy()
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max())
  for x in (t1, t2):  # Targets are stop-gradiented per client too.
    grad = tape.gradient(weighted, x)
    assert grad is None or not np.any(grad.numpy())


def test_prediction_loss_per_client_single_client_and_one_sample_clients():
  rng = np.random.default_rng(8)
  p1, p2, t1, t2 = (rng.normal(size=(4, 3)) for _ in range(4))
  for name, single in (("byol", byol.byol_loss), ("simsiam", simsiam.simsiam_loss)):
    fn = PREDICTION[name]
    np.testing.assert_allclose(fn(p1, p2, t1, t2, [4]).numpy(),
                               [single(p1, p2, t1, t2).numpy()], rtol=1e-12)
    np.testing.assert_allclose(
        fn(p1, p2, t1, t2, [1, 1, 1, 1]).numpy(),
        [single(p1[i:i + 1], p2[i:i + 1], t1[i:i + 1], t2[i:i + 1]).numpy() for i in range(4)],
        rtol=1e-12)
