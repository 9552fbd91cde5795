"""Statistics losses (`tff_ssl.losses.STATISTICS`): each loss's value and gradient against an
independent NumPy implementation of its paper's formula, the union-of-batches fact DCCO rests on, the
per-client and clipped forms, and CCO unchanged by the move into the registry."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import losses
from tff_ssl import ssl as ssl_lib
from tff_ssl.losses import statistics
from tests.losses.test_cco import reference_cco


def reference_vicreg(za, zb, lambd=25.0, mu=25.0, nu=1.0, gamma=1.0, eps=1e-4):
  """VICReg as the paper's Algorithm 1 writes it (unbiased variance and covariance, MSE invariance)."""
  n, d = za.shape
  invariance = np.mean((za - zb) ** 2)
  variance = covariance = 0.0
  for z in (za, zb):
    std = np.sqrt(z.var(axis=0, ddof=1) + eps)
    variance += np.mean(np.maximum(0.0, gamma - std))
    zc = z - z.mean(axis=0)
    cov = zc.T @ zc / (n - 1)
    covariance += sum(cov[i, j] ** 2 for i in range(d) for j in range(d) if i != j) / d
  return lambd * invariance + mu * variance + nu * covariance


def reference_spectral(f, g):
  """HaoChen et al.'s eq. 5 over a batch: -2 mean_i f_i.g_i + mean over i != j of (f_i.g_j)^2."""
  n = len(f)
  positive = np.mean([f[i] @ g[i] for i in range(n)])
  negative = np.mean([(f[i] @ g[j]) ** 2 for i in range(n) for j in range(n) if i != j])
  return -2.0 * positive + negative


HP = ssl_lib.Hparams(cco_lambda=5.0, vicreg_invariance=3.0, vicreg_variance=7.0,
                     vicreg_covariance=2.0)
REFERENCES = {
    "cco": lambda f, g: reference_cco(f, g, 5.0),  # Without the entry's eps = 1e-6 (`EPS`).
    "vicreg": lambda f, g: reference_vicreg(f, g, 3.0, 7.0, 2.0),
    "spectral": reference_spectral,
}
EPS = {"cco": 0.0, "vicreg": None, "spectral": None}  # None: the entry's own (VICReg's is the paper's).


def loss_of(name, f, g):
  entry = losses.STATISTICS[name]
  return entry.loss(entry.statistics(f, g), tf.shape(f)[0], HP, eps=EPS[name])


def encodings(n, d, seed, scale=0.7):
  rng = np.random.default_rng(seed)
  f = scale * rng.normal(size=(n, d)) * rng.uniform(0.3, 1.6, size=d)  # Some stds below 1.
  g = 0.6 * f + 0.4 * scale * rng.normal(size=(n, d)) + 0.3
  return f, g


def numeric_gradient(fn, f, g, h=1e-6):
  """Central differences of a NumPy function of (f, g) with respect to both."""
  grads = []
  for x in (f, g):
    grad = np.zeros_like(x)
    for index in np.ndindex(*x.shape):
      up, down = x.copy(), x.copy()
      up[index] += h
      down[index] -= h
      args_up = (up, g) if x is f else (f, up)
      args_down = (down, g) if x is f else (f, down)
      grad[index] = (fn(*args_up) - fn(*args_down)) / (2 * h)
    grads.append(grad)
  return grads


@pytest.mark.parametrize("name", sorted(losses.STATISTICS))
def test_every_registered_loss_is_checked_against_its_papers_formula(name):
  # The tests below run over REFERENCES: a loss registered without its NumPy reference fails here.
  assert name in REFERENCES, (
      f"statistics loss {name!r}: add its paper's formula in NumPy to REFERENCES")
  assert ssl_lib.get(name).min_samples == 2  # Trainable within a client as well (FedAvg, centralized).


def test_an_unknown_statistics_loss_is_refused_naming_the_choices():
  with pytest.raises(ValueError, match=r"unknown statistics loss 'simclr'; choose one of"):
    losses.get_statistics("simclr")


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_value_equals_the_papers_formula(name):
  for seed, (n, d) in enumerate([(9, 5), (32, 8)]):
    f, g = encodings(n, d, seed)
    np.testing.assert_allclose(float(loss_of(name, f, g)), REFERENCES[name](f, g), rtol=1e-10)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_gradient_equals_the_papers_formula_differentiated_numerically(name):
  f, g = encodings(7, 4, seed=5)
  tf_f, tf_g = tf.constant(f), tf.constant(g)
  with tf.GradientTape() as tape:
    tape.watch([tf_f, tf_g])
    loss = loss_of(name, tf_f, tf_g)
  got = tape.gradient(loss, [tf_f, tf_g])
  want = numeric_gradient(REFERENCES[name], f, g)
  scale = max(np.abs(w).max() for w in want)
  for a, b in zip(got, want):
    # Central differences at h = 1e-6 are good to ~1e-8 of the scale.
    np.testing.assert_allclose(a.numpy(), b, atol=1e-7 * scale)


@pytest.mark.parametrize("name", sorted(losses.STATISTICS))
def test_statistics_of_a_union_are_the_size_weighted_mean_of_the_parts(name):
  entry = losses.STATISTICS[name]
  f, g = encodings(10, 6, seed=2)
  sizes = [1, 3, 6]  # A one-image part: its statistics are exact once combined.
  bounds = np.cumsum([0] + sizes)
  parts = [entry.statistics(f[a:b], g[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
  merged, union = entry.combine(parts, sizes), entry.statistics(f, g)
  for key in entry.names:
    np.testing.assert_allclose(merged[key].numpy(), union[key].numpy(), rtol=1e-12, atol=1e-14)
  np.testing.assert_allclose(float(entry.loss(merged, 10, HP)), float(entry.batch_loss(f, g, HP)),
                             rtol=1e-12)
  unweighted = entry.combine(parts, [1, 1, 1])  # Unweighted averaging is not the union.
  assert not all(np.allclose(unweighted[k].numpy(), union[k].numpy()) for k in entry.names)


@pytest.mark.parametrize("name", sorted(losses.STATISTICS))
def test_per_client_losses_of_concatenated_clients_are_each_clients_own(name):
  entry = losses.STATISTICS[name]
  sizes = [2, 5, 3]
  f, g = encodings(sum(sizes), 6, seed=4)
  bounds = np.cumsum([0] + sizes)
  got = entry.per_client_loss(f, g, sizes, HP).numpy()
  want = [float(entry.batch_loss(f[a:b], g[a:b], HP)) for a, b in zip(bounds[:-1], bounds[1:])]
  np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.parametrize("pairs", [True, False, None])
@pytest.mark.parametrize("name", sorted(losses.STATISTICS))
def test_clipped_sums_clip_each_clients_sum_of_terms_by_its_norm(name, pairs):
  """Unequal clients (one-image ones included) whose rows are interleaved, and a client without
  rows; each outer term's norms from within-client pairs and from the masked Gram matrices."""
  entry = losses.STATISTICS[name]
  sizes = [1, 4, 2, 0, 1]
  f, g = encodings(sum(sizes), 5, seed=6)
  segments = np.array([1, 0, 2, 1, 4, 1, 2, 1])
  rows = [np.flatnonzero(segments == k) for k in range(len(sizes))]
  assert [len(r) for r in rows] == sizes
  sums = [{k: len(r) * v.numpy() for k, v in entry.statistics(f[r], g[r]).items()} if len(r)
          else {k: 0.0 for k in entry.names} for r in rows]
  norms = np.array([np.sqrt(sum(np.sum(np.square(v)) for v in s.values())) for s in sums])
  clip = float(np.median(norms[norms > 0]))
  got, got_norms = entry.clipped_sum(f, g, segments, len(sizes), clip, pairs=pairs)
  np.testing.assert_allclose(got_norms.numpy(), norms, rtol=1e-10)
  factors = np.minimum(1.0, clip / np.where(norms > 0, norms, 1.0))
  assert factors.min() < 1.0
  for key in entry.names:
    want = sum(c * s[key] for c, s in zip(factors, sums))
    np.testing.assert_allclose(got[key].numpy(), want, rtol=1e-10, atol=1e-12)


def test_client_rows_choose_pairs_for_small_clients_and_gram_for_one_large_client():
  small = losses.statistics.ClientRows(np.arange(64), 64, dim=8)
  large = losses.statistics.ClientRows(np.zeros(64, np.int32), 1, dim=8)
  assert bool(small.use_pairs) and not bool(large.use_pairs)


def test_cco_moved_into_the_registry_gives_the_same_numbers_to_the_digit():
  f, g = encodings(16, 8, seed=7)
  f, g = tf.constant(f, tf.float32), tf.constant(g, tf.float32)
  entry = losses.STATISTICS["cco"]
  old = losses.encoding_statistics(f, g)
  new = entry.statistics(f, g)
  for key in entry.names:
    np.testing.assert_array_equal(new[key].numpy(), getattr(old, key).numpy())
  np.testing.assert_array_equal(entry.loss(new, 16, HP).numpy(),
                                losses.cco_loss_from_statistics(old, 5.0).numpy())
  np.testing.assert_array_equal(entry.batch_loss(f, g, HP).numpy(),
                                losses.cco_loss(f, g, 5.0).numpy())


@pytest.mark.parametrize("name", ["vicreg", "spectral"])
def test_within_batch_loss_of_one_image_raises(name):
  with pytest.raises(ValueError, match="at least 2 samples"):
    losses.STATISTICS[name].batch_loss(np.ones((1, 4)), np.ones((1, 4)))


def test_a_perturbed_statistic_changes_each_loss():
  """The terms all matter: nudging any one statistic moves the loss (what the DCCO equivalence tests
  rely on to fail on a wrong statistic)."""
  f, g = encodings(12, 5, seed=8)
  for entry in losses.STATISTICS.values():
    stats = entry.statistics(f, g)
    base = float(entry.loss(stats, 12, HP))
    for key in entry.names:
      nudged = dict(stats, **{key: stats[key] * 1.01 + 1e-3})
      assert abs(float(entry.loss(nudged, 12, HP)) - base) > 1e-9, (entry.name, key)
