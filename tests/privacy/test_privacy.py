"""Privacy on the wire (tff_ssl.privacy): exactness at zero noise, the noise's scale, accounting,
secure sums and compression.

  * DP with noise 0 and no clip is the plain aggregation: DP-FedAvg equals the uniform mean in both
    simulation modes; DP-DCCO (public denominator = the round's images) equals DCCO, one round of it
    one centralized step.
  * The noise's measured standard deviation on known inputs is sigma * C / denominator, for the
    FedAvg-style release (denominator: the clients) and for a release over another denominator
    (DCCO's images); fresh every round, the same for the same seed.
  * A run's epsilon (metrics.csv, results.json) equals dp_accounting's composition of the same
    events; calibration meets its target.
  * A computation built with --secure_aggregation holds the secure-sum intrinsic, and its result is
    within the secure sum's stated bound; quantize8 uploads fewer bytes (read from the types).
"""

import collections
import dataclasses
import json
import os

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from tff_ssl import aggregators, cost
from tff_ssl.aggregators.private import PrivateFactory
from tff_ssl.benchmarks import wire
from tff_ssl.federated import common
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.grouping import Simulation
from tff_ssl.methods.dcco import DCCOConfig, DCCOProcess
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.privacy import PrivacyConfig, accounting
from tff_ssl.privacy.release import PrivateRelease
from tests import spread
from tests.bin.binaries import train_in_process
from tests.methods import test_dcco
from tests.federated.test_grouping import (AUGMENT, LR, REFERENCE, SEED, SGD, SHAPE, plain_model,
                                           rounds_of_clients, run_two_rounds)

EXACT = PrivacyConfig(dp="gaussian_fixed", noise_multiplier=0.0, clip=0.0, statistics_clip=0.0,
                      population=100, clients_per_round=4)


@pytest.mark.parametrize("simulation", [REFERENCE, Simulation(), Simulation(group_size=3)])
def test_dp_fedavg_without_noise_or_clip_is_the_uniform_mean(simulation):
  model = plain_model()
  config = ClientConfig(ssl="simclr", client_learning_rate=LR["simclr"], augment=AUGMENT,
                        seed=SEED)
  rounds = rounds_of_clients([[6, 9, 4, 7], [5, 8, 6, 3]])
  want = run_two_rounds(FedAvgSSLProcess(model, SHAPE, SGD, config, aggregators.UniformFactory(),
                                         simulation=REFERENCE), rounds)
  got = run_two_rounds(FedAvgSSLProcess(model, SHAPE, SGD, config, PrivateFactory(EXACT, 0.0),
                                        simulation=simulation), rounds)
  for r, (g, w) in enumerate(zip(got[0], want[0])):
    spread.within(f"DP-FedAvg (no noise, no clip) vs uniform mean, round {r}",
                  spread.relative_gap(g, w), 1e-5)


@pytest.mark.parametrize("simulation", [REFERENCE, Simulation(group_size=2)])
def test_dp_dcco_without_noise_or_clip_is_one_centralized_step(simulation):
  """DCCO's one-round equivalence through both private releases (noise 0, no clip, the public
  denominator equal to the round's 16 images)."""
  model = test_dcco.model.__wrapped__()
  images, clients = test_dcco.make_clients([1, 2, 4, 9])
  grad = test_dcco.centralized_gradient(model, model.initial_weights, images)
  config = DCCOConfig(client_learning_rate=test_dcco.ETA, augment=test_dcco.AUGMENT,
                      seed=test_dcco.SEED,
                      privacy=dataclasses.replace(EXACT, releases=2), denominator=16.0)
  process = DCCOProcess(model, test_dcco.SHAPE, tff.learning.optimizers.build_sgdm(1.0), config,
                        simulation)
  state = process.initialize()
  new_state, metrics = process.next(state, clients)
  central = [w - test_dcco.ETA * g for w, g in zip(state.weights, grad)]
  spread.within("DP-DCCO (no noise, no clip) round vs centralized SGD step",
                test_dcco.relative_gap(new_state.weights, central,
                                       [test_dcco.ETA * g for g in grad]), 1e-4)
  assert [e.noise_multiplier for e in metrics["dp_events"]] == [0.0, 0.0]


def _release_noise(privacy, sigma, denominator, values, state=None):
  """One private release of `values` (one client each, reference-style) through TFF: (the result,
  the new state)."""
  specs = [tf.TensorSpec(values[0].shape, tf.float32)]
  release = PrivateRelease(privacy, sigma, denominator, specs)
  process = release.create()
  record_type = process.record_type

  @tff.tensorflow.computation(tff.TensorType(np.float32, values[0].shape), process.params_type)
  def clip(value, params):
    return release.add(release.zero(), params, [value])

  @tff.federated_computation()
  def init():
    return process.initialize()

  @tff.federated_computation(init.type_signature.result,
                             tff.FederatedType(tff.TensorType(np.float32, values[0].shape),
                                               tff.CLIENTS))
  def step(state, value):
    records = tff.federated_map(clip, (value, tff.federated_broadcast(process.params(state))))
    result, new_state, _ = process.next(state, records)
    return result, new_state

  del record_type
  return step(init() if state is None else state, values)


def test_noise_std_is_sigma_clip_over_the_denominator():
  """On known inputs (5 clients of norm 3, clipped to 1.5), result - sum(clipped) / D is the noise:
  its std over 40,000 entries is sigma * C / D within 3% (the sampling error is 0.35%), for D the
  clients (FedAvg) and for D the images (DCCO: 5 clients of 8 images)."""
  rng = np.random.default_rng(0)
  values = [rng.normal(size=[40_000]).astype(np.float32) for _ in range(5)]
  values = [3.0 * v / np.linalg.norm(v) for v in values]
  clipped = sum(1.5 * v / 3.0 for v in values)
  privacy = PrivacyConfig(dp="gaussian_fixed", noise_multiplier=2.0, clip=1.5, population=50,
                          clients_per_round=5, seed=7)
  for denominator in (5.0, 40.0):
    result, state = _release_noise(privacy, 2.0, denominator, values)
    noise = np.asarray(result[0]) - clipped / denominator
    spread.within(f"noise std over sigma C / D (D = {denominator})",
                  abs(np.std(noise) / (2.0 * 1.5 / denominator) - 1.0), 0.03)
    assert abs(np.mean(noise)) < 5 * 2.0 * 1.5 / denominator / np.sqrt(noise.size)
    again, _ = _release_noise(privacy, 2.0, denominator, values)
    np.testing.assert_array_equal(again[0], result[0])  # The same seed: the same noise.
    following, _ = _release_noise(privacy, 2.0, denominator, values, state)
    assert np.corrcoef(np.asarray(following[0]) - clipped / denominator, noise)[0, 1] < 0.05


def test_accounting_composes_and_calibrates():
  sigma = accounting.calibrate(4.0, 2, 1000, 20, 50, 1e-3)
  assert abs(accounting.run_epsilon([sigma] * 2, 1000, 20, 50, 1e-3) - 4.0) < 1e-3
  ledger = accounting.Ledger(1e-3)
  event = accounting.round_event([1.3, 1.3], 1000, 20)
  for _ in range(7):
    ledger.add(event)
  direct = accounting.epsilon(dp_accounting.SelfComposedDpEvent(event, 7), 1e-3)
  assert ledger.epsilon() == pytest.approx(direct, rel=1e-12)
  # Replace-one sampling without replacement: a release of sigma has sensitivity 2C.
  assert event.event.events[0].noise_multiplier == pytest.approx(0.65)
  free = accounting.Ledger(1e-3)  # A release without noise has no guarantee.
  free.add(accounting.round_event([0.0, 1.3], 1000, 20))
  assert free.epsilon() == np.inf
  poisson = accounting.round_event([1.3], 1000, 20, "poisson")
  assert poisson.sampling_probability == pytest.approx(0.02)
  assert poisson.event.noise_multiplier == pytest.approx(1.3)


def test_a_runs_epsilon_equals_a_direct_composition(tmp_path):
  """bin/train with DP-DCCO (two releases a round) for 3 rounds of 8 of 200 clients."""
  out = str(tmp_path / "run")
  ended = train_in_process("--task=synthetic_dcco_smoke", "--rounds=3", "--eval_steps=5",
                           "--dp=gaussian_fixed", "--dp_noise_multiplier=1.3",
                           "--dp_statistics_clip=5", f"--output_dir={out}")
  assert ended.returncode == 0, ended.stderr[-2000:]
  config = tasks.get_task("synthetic_dcco_smoke")
  delta = 1.0 / config.num_clients
  sigma = float(np.float32(1.3))  # The events TFF's DP factory records carry float32.
  per_round = [accounting.run_epsilon([sigma, sigma], config.num_clients,
                                      config.clients_per_round, r, delta) for r in (1, 2, 3)]
  with open(os.path.join(out, "metrics.csv")) as f:
    rows = [line.strip().split(",") for line in f]
  column = rows[0].index("epsilon")
  np.testing.assert_allclose([float(r[column]) for r in rows[1:]], per_round, rtol=1e-6)
  with open(os.path.join(out, "results.json")) as f:
    results = json.load(f)
  assert results["epsilon"] == pytest.approx(per_round[-1], rel=1e-12)
  assert results["delta"] == delta and results["dp_noise_multiplier"] == sigma


def test_secure_aggregation_holds_the_intrinsic_and_meets_its_bound():
  t = tff.StructWithPythonType([tff.TensorType(np.float32, [3000]), tff.TensorType(np.float32, [7])],
                               list)
  config = aggregators.AggregatorConfig(name="fedavg",
                                        privacy=PrivacyConfig(secure_aggregation=True))
  process = config.build(plain_model()).create(t, aggregators.client_info_type(t))
  assert "federated_secure_sum_bitwidth" in str(process.next.to_building_block())
  rng = np.random.default_rng(1)
  # Weighted values w_k v_k within the secure sum's first bound (50): |v| <= 5, w <= 9.
  values = [[rng.uniform(-5, 5, [3000]).astype(np.float32),
             rng.uniform(-1, 1, [7]).astype(np.float32)] for _ in range(6)]
  weights = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
  infos = [collections.OrderedDict(num_examples=np.float32(w), loss=np.float32(0.0),
                                   model=[np.zeros(3000, np.float32), np.zeros(7, np.float32)])
           for w in weights]
  out = process.next(process.initialize(), values, infos)
  bound = wire.secure_sum_bound(2 * wire.SECURE_INITIAL_BOUND)
  for i in range(2):
    exact = np.average([v[i] for v in values], axis=0, weights=weights)
    gap = np.max(np.abs(np.asarray(out.result[i]) - exact))
    assert 0 < gap <= bound, (gap, bound)  # Quantized (not exact), within the bound.


def test_dcco_secure_round_holds_the_intrinsic():
  model = test_dcco.model.__wrapped__()
  config = DCCOConfig(client_learning_rate=test_dcco.ETA, augment=test_dcco.AUGMENT,
                      seed=test_dcco.SEED, privacy=PrivacyConfig(secure_aggregation=True))
  process = DCCOProcess(model, test_dcco.SHAPE, tff.learning.optimizers.build_sgdm(1.0), config,
                        REFERENCE)
  text = str(process.private_round.to_building_block())
  assert text.count("federated_secure_sum_bitwidth") >= 2  # The statistics and the update.


def test_compression_uploads_fewer_bytes():
  t = common.tensors_type([tf.TensorSpec([100_000], tf.float32), tf.TensorSpec([10], tf.float32)])
  sizes = {}
  for kind in ("none", "quantize8", "quantize4"):
    config = aggregators.AggregatorConfig(name="fedavg",
                                          privacy=PrivacyConfig(compression=kind))
    process = config.build(plain_model()).create(t, aggregators.client_info_type(t))
    sizes[kind] = cost.upload_bytes(process.next)["total"]
  assert sizes["none"] >= 400_040  # The floats themselves.
  assert sizes["quantize8"] < 0.3 * sizes["none"] and sizes["quantize4"] < 0.6 * sizes["quantize8"]
