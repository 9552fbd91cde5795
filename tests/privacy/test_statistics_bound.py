"""A statistics clip chosen without data: each statistics loss states the largest norm one image's
statistics can have with unit encodings, and `--dp_statistics_clip_at_bound` clips there."""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import losses
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.methods import dcco_private

# A pair of unit encodings that attains each loss's bound.
WORST = {"cco": (1.0, 1.0), "vicreg": (1.0, -1.0), "spectral": (1.0, 1.0)}


def per_image_norms(entry, f, g):
  """Each image's statistics norm: every image its own client of a clipped sum that clips nothing."""
  n = f.shape[0]
  _, norms = entry.clipped_sum(tf.constant(f), tf.constant(g), tf.range(n), n, 1e9)
  return norms.numpy()


@pytest.mark.parametrize("name", sorted(losses.STATISTICS))
def test_unit_encodings_stay_within_the_stated_bound_and_a_pair_attains_it(name):
  entry = losses.STATISTICS[name]
  rng = np.random.default_rng(0)
  f, g = rng.normal(size=(2, 256, 6))
  f /= np.linalg.norm(f, axis=1, keepdims=True)
  g /= np.linalg.norm(g, axis=1, keepdims=True)
  f[:8], g[:8] = f[8:16], f[8:16]  # Some images' two views equal, some opposite.
  g[16:24] = -f[16:24]
  norms = per_image_norms(entry, f, g)
  assert norms.max() <= entry.unit_bound * (1 + 1e-9)
  # In float32 (a run's), within the clip's allowance for round-off.
  norms32 = per_image_norms(entry, f.astype(np.float32), g.astype(np.float32))
  assert norms32.max() <= entry.unit_bound * (1 + dcco_private.BOUND_ROUNDING)
  a, b = WORST[name]
  e1 = np.eye(6)[:1]
  np.testing.assert_allclose(per_image_norms(entry, a * e1, b * e1), [entry.unit_bound], rtol=1e-12)


DP = dict(method="dcco", dataset="synthetic", num_clients=100, samples_per_client=2,
          clients_per_round=10, rounds=2, projector_output="unit", dp="gaussian_fixed",
          dp_noise_multiplier=1.0)


def test_the_clip_at_the_bound_is_samples_per_client_times_the_losss_bound():
  for ssl, bound in (("cco", 5 ** 0.5), ("vicreg", 20 ** 0.5), ("spectral", 2.0)):
    config = ExperimentConfig(ssl=ssl, dp_statistics_clip_at_bound=True, **DP)
    assert config.parsed[0].privacy.statistics_clip == pytest.approx(2 * bound * (1 + 1e-6),
                                                                     rel=1e-12)
  adaptive = ExperimentConfig(ssl="cco", dp_statistics_clip_at_bound=True,
                              **{**DP, "dp": "gaussian_adaptive"}, dp_statistics_clip_rate=0.0)
  assert adaptive.parsed[0].privacy.statistics_clip == pytest.approx(2 * 5 ** 0.5, rel=1e-5)


@pytest.mark.parametrize("change,match", [
    ({"projector_output": "linear"}, "needs a bound on the statistics: use --projector_output=unit"),
    ({"dp_statistics_clip": 3.0}, "drop --dp_statistics_clip=3.0"),
    ({"dp": "gaussian_adaptive"}, "set --dp_statistics_clip_rate=0 .got 0.2."),
    ({"dp": "off", "dp_noise_multiplier": 0.0}, "release; set --dp, or drop it"),
])
def test_a_clip_at_the_bound_that_cannot_hold_is_refused_in_one_line(change, match):
  with pytest.raises(ValueError, match=match):
    ExperimentConfig(ssl="cco", dp_statistics_clip_at_bound=True, **{**DP, **change})
