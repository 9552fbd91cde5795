"""FedProx (tff_ssl/methods/fedprox.py), a method made of one client term: its term is
(mu / 2) ||w - w_t||^2 on hand-made numbers; mu = 0 is FedAvg to the bit; each client reports its
distance from the global model, which equals that of a plain first local step (the term's gradient
is 0 at the broadcast model); and bin/train runs it and logs the round's mean distance."""

import csv

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import client_state, client_work, common
from tff_ssl.methods import fedprox
from tff_ssl.federated.client_work import ClientConfig, Step
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.grouping import Simulation
from tests.bin import binaries
from tests.federated.test_round_anatomy import AUGMENT, SGD, SHAPE, clients_of, resnet

CONFIG = ClientConfig(ssl="simclr", client_learning_rate=0.05, augment=AUGMENT, seed=4,
                      local_steps=2)
ROUNDS = [[0, 1, 2], [1, 3]]


def test_the_term_is_mu_over_two_times_the_squared_distance_to_the_broadcast_model():
  start = [tf.constant([1.0, 2.0]), tf.constant([[3.0]])]
  current = [tf.constant([1.5, 0.0]), tf.constant([[3.0]])]
  step = Step(None, None, start, current, None, None)
  value, distance = fedprox.ProximalTerm(0.1).loss(step, None)
  assert float(value) == pytest.approx(0.05 * (0.25 + 4.0), rel=1e-7)
  assert float(distance) == pytest.approx(np.sqrt(4.25), rel=1e-7)


def run(process, rounds=ROUNDS):
  state, out = process.initialize(), []
  for ids in rounds:
    state, metrics = process.next(state, clients_of(ids), client_ids=ids,
                                  store=client_state.MemoryClientStateStore())
    out.append((state, metrics))
  return out


@pytest.mark.parametrize("simulation", [Simulation(mode="reference"), Simulation(group_size=2)],
                         ids=["reference", "grouped"])
def test_mu_zero_is_fedavg_to_the_bit(simulation):
  model = resnet()
  plain = run(FedAvgSSLProcess(model, SHAPE, SGD, CONFIG, simulation=simulation))
  zero = run(FedAvgSSLProcess(model, SHAPE, SGD, CONFIG.with_terms(fedprox.ProximalTerm(0.0)),
                              simulation=simulation))
  for (a, ma), (b, mb) in zip(plain, zero):
    for x, y in zip(a.weights, b.weights):
      np.testing.assert_array_equal(x, y)
    assert ma["loss"] == mb["loss"]
    assert "fedprox_distance" in mb["aggregation"]


def test_each_client_reports_its_distance_after_a_plain_first_step():
  model = resnet()
  process = FedAvgSSLProcess(model, SHAPE, SGD, CONFIG.with_terms(fedprox.ProximalTerm(1.0)),
                             simulation=Simulation(group_size=2))
  ids = [2, 0, 3]
  state = process.initialize()
  out = process.compute_update(state, clients_of(ids), client_ids=ids)
  reports = out["reports"]
  assert reports["client"].tolist() == ids
  one_step = ClientConfig(ssl="simclr", client_learning_rate=0.05, augment=AUGMENT, seed=4)
  seed = common.round_seed(CONFIG.seed, 0)
  want = []
  for client in clients_of(ids):
    delta, _, _, _ = client_work.local_training(
        model, one_step, [tf.constant(w) for w in state.weights], seed, client)
    want.append(np.sqrt(sum(float(tf.reduce_sum(tf.square(d))) for d in delta)))
  np.testing.assert_allclose(reports["fedprox"]["distance"], want, rtol=1e-4)
  assert all(w > 0 for w in want)


def test_bin_train_runs_fedprox_and_logs_the_mean_distance(tmp_path):
  out = tmp_path / "fedprox"
  ended = binaries.train_in_process(
      f"--output_dir={out}", "--task=synthetic_dcco_smoke", "--method=fedprox", "--ssl=simclr",
      "--samples_per_client=2", "--rounds=2", "--eval_steps=10", "--client_learning_rate=0.05",
      "--local_steps=2",
      "--fedprox_mu=0.1")
  assert ended.returncode == 0, ended.stderr
  with open(out / "aggregation.csv") as f:
    rows = list(csv.DictReader(f))
  # Two local steps: the distance at the start of the second is the first step's.
  assert [float(r["fedprox_distance"]) > 0 for r in rows] == [True, True]
  with pytest.raises(ValueError, match="fedprox_mu must be >= 0"):
    ExperimentConfig(method="fedprox", ssl="simclr", fedprox_mu=-1.0)
