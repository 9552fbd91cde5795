"""NT-Xent against an independent NumPy reference."""

import numpy as np
import pytest

from tff_ssl.ssl import simclr


def reference_nt_xent(z1, z2, t):
  z = np.concatenate([z1, z2])
  z = z / np.linalg.norm(z, axis=1, keepdims=True)
  n2 = z.shape[0]
  n = n2 // 2
  total = 0.0
  for a in range(n2):
    pos = (a + n) % n2
    sims = np.array([z[a] @ z[b] / t for b in range(n2) if b != a])
    total += -(z[a] @ z[pos] / t) + np.log(np.exp(sims).sum())
  return total / n2


def test_matches_numpy_reference():
  rng = np.random.default_rng(0)
  z1, z2 = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
  for t in (0.1, 0.5, 1.0):
    np.testing.assert_allclose(simclr.nt_xent_loss(z1, z2, t).numpy(),
                               reference_nt_xent(z1, z2, t), rtol=1e-10)


def test_symmetric_in_views():
  rng = np.random.default_rng(1)
  z1, z2 = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
  np.testing.assert_allclose(simclr.nt_xent_loss(z1, z2).numpy(),
                             simclr.nt_xent_loss(z2, z1).numpy(), rtol=1e-12)


def test_hand_computed_two_samples():
  # z1 = z2 = two orthogonal unit vectors; t = 1. Each anchor: positive sim 1, negatives 0 and 0:
  # loss = -1 + log(e^1 + e^0 + e^0).
  e = np.eye(2)
  np.testing.assert_allclose(simclr.nt_xent_loss(e, e, 1.0).numpy(), -1 + np.log(np.e + 2),
                             rtol=1e-12)


def test_one_sample_and_bad_temperature_raise():
  with pytest.raises(ValueError, match="at least 2 samples"):
    simclr.nt_xent_loss(np.ones((1, 3)), np.ones((1, 3)))
  with pytest.raises(ValueError, match="temperature"):
    simclr.nt_xent_loss(np.ones((2, 3)), np.ones((2, 3)), 0.0)
