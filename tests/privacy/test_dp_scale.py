"""DP at the cohort sizes where it learns (issue 53): one-image users over the whole split, Poisson
client sampling, a simulated noise cohort (`--dp_noise_cohort`) and each release's measured
noise-to-signal.

  * per_image: every image of the split one client, once; a population other than the split's or
    more than one image a client is refused in one line.
  * Poisson sampling: a pure function of (seed, round); rounds of Binomial(N, q) size; refused where
    some round would sample nobody with probability above 1e-6, and across --workers; fixed-size
    sampling is today's `tff.simulation` sampler, unchanged.
  * A simulated noise cohort K': the noise's measured std is sigma C (K / K') / D; the ledger's
    epsilon is dp_accounting's for K' clients a round at sigma, epsilon_actual the run's own (K
    clients at sigma K / K'); calibration meets its target at K'; gaussian_adaptive splits its
    noise as the K'-client round does and scales both parts; the refusals (K' < K, K' > N) are one
    line.
  * A release's noise and signal norms are the noise's and the clipped sum's.
  * bin/train end to end (Poisson, a noise cohort, PLD): metrics.csv's epsilon per round (against
    dp_accounting's PLD accountant on a hand-built event), its dp_noise_cohort and
    epsilon_convention columns, results.json's label, convention and both epsilons.
"""

import dataclasses
import json
import os

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from tff_ssl import runner
from tff_ssl.data import partition
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import sampling
from tff_ssl.observers import PrivacyLedger
from tff_ssl.privacy import PrivacyConfig, accounting
from tff_ssl.privacy.release import PrivateRelease
from tests import spread
from tests.bin.binaries import train_in_process

DCCO = dict(method="dcco", dataset="synthetic", samples_per_client=1, num_clients=1000,
            clients_per_round=40, rounds=50)


def test_per_image_partition_is_every_image_once():
  rows = partition.per_image_partition(500, num_clients=500, seed=3)
  assert rows.shape == (500, 1) and sorted(rows[:, 0]) == list(range(500))
  assert not np.array_equal(rows[:, 0], np.arange(500))  # A seeded order, not the split's.
  np.testing.assert_array_equal(rows, partition.per_image_partition(500, num_clients=500, seed=3))
  with pytest.raises(ValueError, match="set --num_clients=500") as e:
    partition.per_image_partition(500, num_clients=499, seed=3)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="set --samples_per_client=1"):
    ExperimentConfig(**dict(DCCO, partition="per_image", samples_per_client=2))


def test_poisson_sampling_is_seeded_and_of_binomial_size():
  sample = sampling.round_sampler("poisson", 1000, 40, seed=5)
  sizes = [len(sample(r)) for r in range(400)]
  assert sample(7) == sampling.round_sampler("poisson", 1000, 40, seed=5)(7)
  assert sample(7) != sample(8) and sample(7) == sorted(set(sample(7)))
  # Binomial(1000, 0.04): mean 40, std 6.2; over 400 rounds the mean's std is 0.31.
  assert abs(np.mean(sizes) - 40) < 1.5 and 4.5 < np.std(sizes) < 8.0
  fixed = sampling.round_sampler("fixed", 1000, 40, seed=5)
  want = tff.simulation.build_uniform_sampling_fn(list(range(1000)), replace=False, random_seed=5)
  assert fixed(3) == [int(c) for c in want(3, 40)] and len(set(fixed(3))) == 40


def test_poisson_refusals():
  # (1 - 8/200)^200 = 2.9e-4 a round: refused, and the message names the cohort that fits.
  with pytest.raises(ValueError, match="raise clients_per_round to >= 14") as e:
    ExperimentConfig(**dict(DCCO, num_clients=200, clients_per_round=8, rounds=2,
                            client_sampling="poisson"))
  assert "\n" not in str(e.value)
  assert sampling.empty_round_probability(200, 14, 2) <= sampling.EMPTY_RUN_BOUND
  config = ExperimentConfig(**dict(DCCO, client_sampling="poisson", group_size=8))
  with pytest.raises(ValueError, match="use --client_sampling=fixed"):
    runner.check_workers(config, ["a:1", "b:2"])


def test_noise_cohort_scales_the_noise_and_accounts_for_its_cohort():
  """K = 5 clients of norm 3 clipped to 1.5, noise of a K' = 20 cohort at sigma 2: the noise's std
  is sigma C (K / K') / D (within 3%; sampling error 0.35%); the release's measured norms are the
  noise's and the clipped sum's."""
  rng = np.random.default_rng(0)
  values = [rng.normal(size=[40_000]).astype(np.float32) for _ in range(5)]
  values = [3.0 * v / np.linalg.norm(v) for v in values]
  clipped = sum(1.5 * v / 3.0 for v in values)
  privacy = PrivacyConfig(dp="gaussian_fixed", noise_multiplier=2.0, clip=1.5, population=50,
                          clients_per_round=5, noise_cohort=20, seed=7)
  assert privacy.noise_scale == 0.25 and privacy.label == "noise simulated for a cohort of 20"
  denominator = 5.0
  release = PrivateRelease(privacy, 2.0, denominator, [tf.TensorSpec([40_000], tf.float32)])
  process = release.create()
  value_type = tff.TensorType(np.float32, [40_000])

  @tff.tensorflow.computation(value_type, process.params_type)
  def contribute(value, params):
    return release.fold(release.empty(), params, [value])

  @tff.federated_computation()
  def init():
    return process.initialize()

  @tff.federated_computation(init.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS))
  def step(state, value):
    out = tff.federated_map(contribute, (value, tff.federated_broadcast(process.params(state))))
    result, _, measured = process.release_of(state, out)
    return result, measured

  result, measured = step(init(), values)
  noise = np.asarray(result[0]) - clipped / denominator
  spread.within("noise std over sigma C (K / K') / D",
                abs(np.std(noise) / (2.0 * 1.5 * 0.25 / denominator) - 1.0), 0.03)
  assert measured["signal_norm"] == pytest.approx(np.linalg.norm(clipped), rel=1e-5)
  assert measured["noise_norm"] == pytest.approx(denominator * np.linalg.norm(noise), rel=1e-4)
  assert measured["clipped"] == 5.0


@pytest.mark.parametrize("client_sampling,kind", [("fixed", "rdp"), ("poisson", "rdp"),
                                                   ("poisson", "pld")])
def test_ledger_accounts_the_simulated_cohort_and_the_runs_own(client_sampling, kind):
  """The events TFF's factory records carry the noise actually added (sigma K / K'); the ledger's
  epsilon is the K'-client run's, epsilon_actual this run's (by the run's accountant)."""
  config = ExperimentConfig(**dict(DCCO, dp="gaussian_fixed", dp_noise_multiplier=1.2,
                                   dp_noise_cohort=160, client_sampling=client_sampling,
                                   dp_accountant=kind))
  ledger = PrivacyLedger(config)
  recorded = [dp_accounting.GaussianDpEvent(1.2 * 40 / 160)] * 2
  for r in range(3):
    metrics = {"dp_events": recorded, "aggregation": {}}
    released = {}
    ledger.after_round(r, None, metrics, released)
  delta = 1.0 / 1000
  want = accounting.run_epsilon([1.2, 1.2], 1000, 160, 3, delta, client_sampling, kind)
  actual = accounting.run_epsilon([0.3, 0.3], 1000, 40, 3, delta, client_sampling, kind)
  assert released["epsilon"] == pytest.approx(want, rel=1e-6)
  assert released["dp_noise_cohort"] == 160
  assert metrics["aggregation"]["epsilon_actual"] == pytest.approx(actual, rel=1e-6)
  summary = ledger.summary()
  assert summary["epsilon"] == pytest.approx(want, rel=1e-12) and actual > 2 * want
  assert summary["dp_label"] == "noise simulated for a cohort of 160"
  assert summary["dp_noise_multiplier"] == pytest.approx(1.2)
  assert summary["dp_noise_multiplier_actual"] == pytest.approx(0.3)
  # Calibration at the simulated cohort meets its target.
  target = dataclasses.replace(config, dp_noise_multiplier=0.0, dp_target_epsilon=4.0)
  p = PrivacyConfig(dp="gaussian_fixed", target_epsilon=4.0, population=1000, clients_per_round=40,
                    rounds=50, noise_cohort=160, sampling=client_sampling, releases=2,
                    accountant=kind)
  got = accounting.run_epsilon([p.sigma] * 2, 1000, 160, 50, delta, client_sampling, kind)
  assert summary["dp_convention"] == p.convention.key
  assert 4.0 - 0.01 <= got <= 4.0 and target.dp_noise_cohort == 160


@pytest.mark.parametrize("fields,reason", [
    (dict(dp_noise_cohort=20), "between the run's cohort"),
    (dict(dp_noise_cohort=1001), "between the run's cohort"),
    (dict(dp_noise_cohort=100, dp="off", dp_noise_multiplier=0.0), "only with --dp"),
    (dict(dp_statistics_quantile=1.0), "dp_statistics_quantile"),
    (dict(dp_statistics_quantile=0.0), "dp_statistics_quantile"),
    (dict(dp_statistics_clip_rate=-0.1), "dp_statistics_clip_rate"),
], ids=["below the cohort", "above the population", "without DP", "quantile 1", "quantile 0",
        "negative clip rate"])
def test_noise_cohort_refusals(fields, reason):
  base = dict(DCCO, dp="gaussian_fixed", dp_noise_multiplier=1.0)
  with pytest.raises(ValueError) as e:
    ExperimentConfig(**dict(base, **fields))
  assert reason in str(e.value) and "\n" not in str(e.value)


def _pld_epsilon(sigmas, q, rounds, delta):
  """dp_accounting's own PLD accountant over `rounds` Poisson-sampled rounds of releases of noise
  `sigmas` (one sample: one Gaussian of 1 / sqrt(sum sigma^-2)), built here by hand."""
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=accounting.PLD_INTERVAL)
  sigma = 1.0 / np.sqrt(sum(s ** -2.0 for s in sigmas))
  acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      q, dp_accounting.GaussianDpEvent(sigma)), rounds))
  return acc.get_epsilon(delta)


def test_a_poisson_run_with_a_noise_cohort_is_labelled_end_to_end(tmp_path):
  """bin/train, DP-DCCO (two releases), Poisson sampling of 16 of 200 clients, the noise of a
  cohort of 64, 2 rounds, accounted by PLD (add/remove): every output names the convention."""
  out = str(tmp_path / "run")
  ended = train_in_process("--task=synthetic_dcco_smoke", "--eval_steps=5", "--clients_per_round=16",
                           "--client_sampling=poisson", "--dp=gaussian_fixed",
                           "--dp_noise_multiplier=1.3", "--dp_noise_cohort=64",
                           "--dp_statistics_clip=5", "--dp_accountant=pld", f"--output_dir={out}")
  assert ended.returncode == 0, ended.stderr[-2000:]
  assert "noise simulated for a cohort of 64" in ended.stderr + ended.stdout
  assert "(PLD, Poisson sampling, add/remove" in ended.stdout
  config = tasks.get_task("synthetic_dcco_smoke")
  delta = 1.0 / config.num_clients
  sigma = float(np.float32(1.3 * 16 / 64)) * 64 / 16  # TFF's events carry float32 noise.
  want = [_pld_epsilon([sigma] * 2, 64 / 200, r, delta) for r in (1, 2)]
  with open(os.path.join(out, "metrics.csv")) as f:
    rows = [line.strip().split(",") for line in f]
  eps, cohort = rows[0].index("epsilon"), rows[0].index("dp_noise_cohort")
  np.testing.assert_allclose([float(r[eps]) for r in rows[1:]], want, rtol=1e-6)
  assert [float(r[cohort]) for r in rows[1:]] == [64.0, 64.0]
  conv = rows[0].index("epsilon_convention")
  assert [r[conv] for r in rows[1:]] == ["pld/poisson/add_remove"] * 2
  with open(os.path.join(out, "aggregation.csv")) as f:
    agg = [line.strip().split(",") for line in f]
  sizes = [float(r[agg[0].index("clients")]) for r in agg[1:]]
  sample = sampling.round_sampler("poisson", 200, 16, config.seed)
  assert sizes == [len(sample(0)), len(sample(1))]
  for name in ("statistics_noise_to_signal", "update_noise_to_signal"):
    assert all(float(r[agg[0].index(name)]) > 0 for r in agg[1:])
  with open(os.path.join(out, "results.json")) as f:
    results = json.load(f)
  assert results["epsilon"] == pytest.approx(want[-1], rel=1e-6)
  assert results["dp_label"] == "noise simulated for a cohort of 64"
  assert results["client_sampling"] == "poisson"
  assert (results["dp_accountant"], results["dp_relation"], results["dp_convention"]) == (
      "pld", "add_remove", "pld/poisson/add_remove")
  assert results["epsilon_actual"] == pytest.approx(
      _pld_epsilon([sigma * 16 / 64] * 2, 16 / 200, 2, delta), rel=1e-5)


def test_adaptive_noise_cohort_is_the_larger_rounds_split_scaled():
  """gaussian_adaptive with K' = 400 of K = 100: TFF's split of sigma for 400 clients, the value's
  and the clipped count's noise both times K / K'."""
  from tensorflow_federated.python.aggregators.differential_privacy import \
      adaptive_clip_noise_params
  p = PrivacyConfig(dp="gaussian_adaptive", noise_multiplier=1.5, clip=2.0, population=1000,
                    clients_per_round=100, noise_cohort=400)
  query = p.query(1.5, 100.0).inner._numerator  # pylint: disable=protected-access
  value_sigma, count_std = adaptive_clip_noise_params(1.5, 400.0)
  assert query._noise_multiplier == pytest.approx(value_sigma / 4)  # pylint: disable=protected-access
  estimator = query._quantile_estimator_query  # pylint: disable=protected-access
  below = estimator._below_estimate_query._numerator  # pylint: disable=protected-access
  assert below._stddev == pytest.approx(count_std / 4)  # pylint: disable=protected-access
  # The votes are averaged over the real cohort's expected clients.
  assert estimator._below_estimate_query._denominator == 100.0  # pylint: disable=protected-access


@pytest.mark.parametrize("noise_cohort", [0, 400])
def test_an_adaptive_rounds_noise_multiplier_is_the_calibrated_sigma(noise_cohort):
  """results.json's dp_noise_multiplier of a gaussian_adaptive run: TFF's query reports its values'
  and clipped count's Gaussians apart; together (1 / sqrt of the sum of 1 / sigma_i^2) they are
  the sigma it was given (with a noise cohort, as accounted: scaled back by K' / K)."""
  p = PrivacyConfig(dp="gaussian_adaptive", noise_multiplier=1.5, clip=2.0, population=1000,
                    clients_per_round=100, noise_cohort=noise_cohort)
  query = p.query(1.5, 100.0)
  state = query.initial_global_state()
  sample = query.initial_sample_state(tf.TensorSpec([3], tf.float32))
  _, _, event = query.get_noised_result(sample, state)
  assert len(event.events) == 2
  assert accounting.noise_multiplier(accounting.scaled(event, 1.0 / p.noise_scale)) == (
      pytest.approx(1.5, rel=1e-6))
  assert accounting.noise_multiplier(dp_accounting.GaussianDpEvent(0.7)) == 0.7
  assert accounting.noise_multiplier(dp_accounting.NonPrivateDpEvent()) == 0.0


@pytest.mark.parametrize("noise_cohort", [0, 400])
def test_a_fixed_statistics_clip_beside_an_adaptive_update_clip(noise_cohort):
  """gaussian_adaptive at --dp_statistics_clip_rate=0: the statistics release is a fixed clip's
  Gaussian sum whose noise is the whole sigma times its clip (none of it split off to a clipped
  count), times K / K' with a noise cohort; the update's release stays TFF's adaptive query."""
  p = PrivacyConfig(dp="gaussian_adaptive", noise_multiplier=1.5, clip=2.0, statistics_clip=3.0,
                    statistics_clip_rate=0.0, population=1000, clients_per_round=100,
                    noise_cohort=noise_cohort, releases=2)
  assert not p.release_adaptive(statistics=True) and p.release_adaptive(statistics=False)
  scale = 100 / noise_cohort if noise_cohort else 1.0
  for statistics, events in ((True, 1), (False, 2)):
    query = p.query(1.5, 100.0, statistics=statistics)
    state = query.initial_global_state()
    sample = query.initial_sample_state(tf.TensorSpec([3], tf.float32))
    _, _, event = query.get_noised_result(sample, state)
    assert len(getattr(event, "events", [event])) == events
    assert accounting.noise_multiplier(accounting.scaled(event, 1.0 / scale)) == (
        pytest.approx(1.5, rel=1e-6))
  numerator = p.query(1.5, 100.0, statistics=True).inner._numerator  # pylint: disable=protected-access
  assert numerator._l2_norm_clip == 3.0  # pylint: disable=protected-access
  assert numerator._stddev == pytest.approx(3.0 * 1.5 * scale)  # pylint: disable=protected-access
  spec = [tf.TensorSpec([3], tf.float32)]
  assert not PrivateRelease(p, 1.5, 100.0, spec, statistics=True).adaptive
  assert PrivateRelease(p, 1.5, 100.0, spec, release=1).adaptive
