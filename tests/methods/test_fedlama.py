"""FedLAMA (L-DAWA's EUC row): the choice of relaxed layers by hand, a client's start from its own and
the global tensors, and whole rounds checked against NumPy: which layers are aggregated, their FedAvg
value, the discrepancy, the intervals; both simulation modes the same."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import client_state
from tff_ssl.federated import masks
from tff_ssl.methods.fedfoa import FeatureCorrelationConfig
from tff_ssl.methods import fedfoa, fedlama, fedu2
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.grouping import Simulation
from tests.federated.test_round_anatomy import AUGMENT, SHAPE, clients_of, resnet
from tests import spread

# --- The choice of relaxed layers, by hand -----------------------------------------------------------


def test_relaxed_layers_by_hand():
  # Per parameter: 3, 0.5, 0.5; ascending (stable): layers 1, 2, 0. Total discrepancy 10, size 10.
  # Layer 1: delta 0.1, 1 - lambda 0.8: go on. Layer 2: delta 0.4, 1 - lambda 0.2 < 0.4: stop.
  np.testing.assert_array_equal(fedlama.relaxed_layers([6.0, 1.0, 3.0], [2, 2, 6]),
                                [False, True, True])
  # The first layer walked is always relaxed, and a big one ends the walk at once (ties in the
  # discrepancy per parameter keep the layers' order): delta 0.8 > 1 - lambda = 0.2.
  np.testing.assert_array_equal(fedlama.relaxed_layers([8.0, 1.0, 1.0], [8, 1, 1]),
                                [True, False, False])
  # Equal shares all the way: the last layer (1 - lambda = 0) ends it, every layer relaxed.
  np.testing.assert_array_equal(fedlama.relaxed_layers([1.0, 1.0, 8.0], [1, 1, 8]),
                                [True, True, True])
  # No discrepancy anywhere: every layer relaxed.
  np.testing.assert_array_equal(fedlama.relaxed_layers([0.0, 0.0], [3, 5]), [True, True])


def test_bad_settings_name_the_value():
  with pytest.raises(ValueError, match="fedlama_phi must be >= 1"):
    ExperimentConfig(method="fedlama", ssl="simclr", fedlama_phi=0)
  with pytest.raises(ValueError, match="fedlama_interval must be >= 1; got 0"):
    ExperimentConfig(method="fedlama", ssl="simclr", fedlama_interval=0)
  with pytest.raises(ValueError, match="--aggregator is not used by method 'fedlama'"):
    ExperimentConfig(method="fedlama", ssl="simclr").check_fields_for_method({"aggregator"})


# --- A client's start ------------------------------------------------------------------------------


class Specs:  # What `spec` needs of a model.
  weight_specs = [tf.TensorSpec([2], tf.float32)] * 2


def test_a_client_keeps_its_copy_of_a_tensor_not_aggregated_since_its_last_round():
  lib = fedlama.LayerStaleness(masks.TensorMask.all(2))
  glob = [tf.constant([1.0, 1.0]), tf.constant([2.0, 2.0])]
  new = lib.initial(Specs())
  assert float(new["last_round"]) == -1.0
  context = collections.OrderedDict(fedlama=collections.OrderedDict(
      round=tf.constant(3.0), last_sync=tf.constant([2.0, 1.0])))
  start = lib.begin(new, glob, context)  # A new client: the global model.
  np.testing.assert_array_equal([s.numpy() for s in start], [[1, 1], [2, 2]])
  own = collections.OrderedDict(last_round=tf.constant(2.0),
                                own=[tf.constant([5.0, 5.0]), tf.constant([7.0, 7.0])])
  # Tensor 0 was aggregated in round 2, the client's last (the global holds its training): global.
  # Tensor 1 was last aggregated in round 1: the client's own copy.
  start = lib.begin(own, glob, context)
  np.testing.assert_array_equal([s.numpy() for s in start], [[1, 1], [7, 7]])
  after = lib.end(own, glob, [tf.constant([0.5, 0.5]), tf.constant([-1.0, -1.0])], 4.0, 0.0,
                  context=context)
  assert float(after["last_round"]) == 3.0
  np.testing.assert_array_equal([t.numpy() for t in after["own"]], [[0.5, 0.5], [3, 3]])


# --- Whole rounds ----------------------------------------------------------------------------------

CONFIG = ClientConfig(ssl="simclr", client_learning_rate=0.05, augment=AUGMENT, seed=4)
SGD = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
SIZES = {0: 4, 1: 6, 2: 3}  # Every client takes part in every round (cross-silo), unequal N_k.
ROUNDS = 4


def clients():
  return [clients_of([c], n)[0] for c, n in SIZES.items()]


def fedlama_process(simulation, stages=(), lama_last=False):
  """The FedAvg process with FedLAMA's stage first (and `stages` after it; `lama_last`: before)."""
  model = resnet()
  lama = (fedlama.FedLAMAStage(model, fedlama.FedLAMAConfig(interval=1, phi=2)),)
  return FedAvgSSLProcess(model, SHAPE, SGD, CONFIG, simulation=simulation,
                          stages=tuple(stages) + lama if lama_last else lama + tuple(stages))


def lama_state(state):
  """FedLAMA's part of a server state's method state."""
  return state.method_state[fedlama.KEY]


def run(simulation):
  process = fedlama_process(simulation)
  store = client_state.MemoryClientStateStore()
  server, measured = [process.initialize()], []
  for _ in range(ROUNDS):
    state, metrics = process.next(server[-1], clients(), client_ids=list(SIZES), store=store)
    server.append(state)
    measured.append(metrics["aggregation"])
  return process, server, store, measured


@pytest.fixture(scope="module")
def runs():
  return {"reference": run(Simulation(mode="reference")),
          "grouped": run(Simulation(group_size=2))}


def test_rounds_match_numpy(runs):
  """Each round, from the clients' stored own tensors: the aggregated layers are their N_k-weighted
  mean, the others keep the global value; the discrepancy is sum_k p_k ||x_k - u||^2; the intervals
  after rounds 1 and 3 are `relaxed_layers` of it."""
  process, server, store, measured = runs["reference"]
  groups, sizes = process.stages[0].group_index, process.stages[0].sizes
  p = np.array(list(SIZES.values()), np.float64) / sum(SIZES.values())
  initial = process._initial_client_state  # pylint: disable=protected-access
  relaxed_seen = []
  for r in range(ROUNDS):
    before, after = server[r], server[r + 1]
    synced = (r + 1) % np.asarray(lama_state(before)["interval"]) == 0
    own = [[np.asarray(t, np.float64) for t in store.read([c], r + 1, initial)[0]["own"]]
           for c in SIZES]
    assert [float(store.read([c], r + 1, initial)[0]["last_round"]) for c in SIZES] == [r] * 3
    mean = [sum(p[k] * own[k][t] for k in range(3)) for t in range(len(groups))]
    d = np.zeros(len(sizes))
    for t, g in enumerate(groups):
      if synced[g]:
        np.testing.assert_allclose(after.weights[t], mean[t], atol=1e-5)
        d[g] += sum(p[k] * np.sum((own[k][t] - mean[t]) ** 2) for k in range(3))
      else:
        np.testing.assert_array_equal(after.weights[t], before.weights[t])
    disc = np.asarray(lama_state(after)["discrepancy"])
    interval = np.asarray(lama_state(before)["interval"])
    np.testing.assert_allclose(disc[synced], (d / interval)[synced], rtol=2e-3, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(lama_state(after)["last_sync"])[synced[groups]], r)
    assert float(measured[r]["fedlama_synced"]) == pytest.approx(sizes[synced].sum() / sizes.sum())
    if r in (1, 3):  # Every layer aggregated, then the intervals adjusted.
      assert synced.all()
      relaxed = fedlama.relaxed_layers(disc, sizes)
      np.testing.assert_array_equal(lama_state(after)["interval"], np.where(relaxed, 2, 1))
      relaxed_seen.append(relaxed)
  # Round 2 aggregated only the layers not relaxed after round 1 (some of each).
  assert 0 < relaxed_seen[0].sum() < len(sizes)


def test_a_relaxed_layer_trains_on_from_the_clients_own_copy(runs):
  """Round 2 did not aggregate the relaxed layers, so round 3 starts each client from its own copy of
  them: the global of round 3 is the mean of models trained from different starts."""
  process, server, store, _ = runs["reference"]
  relaxed = np.asarray(lama_state(server[2])["interval"]) == 2
  initial = process._initial_client_state  # pylint: disable=protected-access
  state = store.read([1], 3, initial)[0]  # Client 1 after round 2.
  context = process.client_context(server[3])
  start = process.client_state.begin(
      tf.nest.map_structure(tf.constant, state), [tf.constant(w) for w in server[3].weights],
      tf.nest.map_structure(tf.constant, context))
  for t, g in enumerate(process.stages[0].group_index):
    want = state["own"][t] if relaxed[g] else server[3].weights[t]
    np.testing.assert_array_equal(start[t].numpy(), want)
  assert any(relaxed[g] and not np.array_equal(state["own"][t], server[3].weights[t])
             for t, g in enumerate(process.stages[0].group_index))


def test_both_simulation_modes_give_the_same_rounds(runs):
  (_, ref, ref_store, _), (_, grp, grp_store, _) = runs["reference"], runs["grouped"]
  # Four rounds apart, not re-anchored: largest relative gap seen 1.6e-7 (four oneDNN
  # set-ups). The
  # intervals are decisions on the clients' discrepancies, taken far from their thresholds here.
  spread.within("FedLAMA weights after 4 rounds, grouped vs reference",
                spread.relative_gap(grp[-1].weights, ref[-1].weights), 1e-5)
  np.testing.assert_array_equal(lama_state(ref[-1])["interval"], lama_state(grp[-1])["interval"])
  for c in SIZES:
    for a, b in zip(ref_store.read([c], ROUNDS, None)[0]["own"],
                    grp_store.read([c], ROUNDS, None)[0]["own"]):
      np.testing.assert_allclose(a, b, atol=1e-5 * max(1.0, np.abs(a).max()))


# --- With FedFoA: two server stages in one process -----------------------------------------------


def test_fedfoa_and_fedlama_run_together():
  """FedLAMA's stage and FedFoA's in one FedAvg process: each keeps its part of the method state and
  of the broadcast; the clients keep FedLAMA's own copies and align to the other clients' R after
  FedFoA's warm-up round; a layer FedLAMA does not aggregate keeps its global value exactly."""
  dim = 8  # resnet()'s projection; FedFoA's clients need at least dim images.
  fc = FeatureCorrelationConfig(warmup=1, bank_size=3, select="all")
  process = fedlama_process(Simulation(group_size=2), stages=(fedfoa.FedFoAStage(fc, dim),))
  ids = list(SIZES)
  store = client_state.MemoryClientStateStore()
  server, agg = [process.initialize()], []
  assert list(server[0].method_state) == [fedlama.KEY, fedfoa.KEY]
  assert list(process.client_context(server[0])) == [fedlama.KEY, fedfoa.KEY]
  for _ in range(3):
    state, metrics = process.next(server[-1], clients_of(ids, n=dim), client_ids=ids, store=store)
    server.append(state)
    agg.append(metrics["aggregation"])
  # FedFoA: warm-up in round 0; then each client aligns to the two entries not its own.
  assert float(agg[0]["fedfoa_partners"]) == 0 and float(agg[0]["fedfoa_term"]) == 0
  assert float(agg[1]["fedfoa_partners"]) == 2 and float(agg[1]["fedfoa_term"]) > 0
  assert sorted(server[-1].method_state[fedfoa.KEY]["ids"].tolist()) == ids
  # FedLAMA: every layer in rounds 0 and 1, the intervals chosen after round 1; round 2 leaves the
  # relaxed layers at their global value and the clients keep their own copies.
  relaxed = np.asarray(lama_state(server[2])["interval"]) == 2
  assert 0 < relaxed.sum() < len(relaxed)
  assert float(agg[2]["fedlama_synced"]) < 1.0
  for t, g in enumerate(process.stages[0].group_index):
    if relaxed[g]:
      np.testing.assert_array_equal(server[3].weights[t], server[2].weights[t])
  own = store.read([0], 3, None)[0]
  assert float(own["last_round"]) == 2.0 and len(own["own"]) == len(server[3].weights)
  # The other order (FedFoA's stage first): FedFoA wraps FedLAMA's state all the same, and the
  # round is the same to the bit (FedFoA's stage leaves the update alone).
  other = fedlama_process(Simulation(group_size=2), stages=(fedfoa.FedFoAStage(fc, dim),),
                          lama_last=True)
  store, state = client_state.MemoryClientStateStore(), other.initialize()
  for r in range(3):
    state, metrics = other.next(state, clients_of(ids, n=dim), client_ids=ids, store=store)
    assert sorted(metrics["aggregation"]) == sorted(agg[r])
    for key, value in agg[r].items():
      np.testing.assert_array_equal(metrics["aggregation"][key], value)
  for got, want in zip(state.weights, server[3].weights):
    np.testing.assert_array_equal(got, want)


def test_stages_whose_order_would_matter_are_refused_in_one_line():
  model = resnet()
  lama = fedlama.FedLAMAStage(model, fedlama.FedLAMAConfig(interval=1, phi=2))
  eua = fedu2.UnifiedAggregation(size=10)
  with pytest.raises(ValueError, match="^server stages 'fedlama' and 'fedu2_eua' both change the "
                     "round's update, so their order would change the round; use one of them$"):
    FedAvgSSLProcess(model, SHAPE, SGD, CONFIG, stages=(lama, eua))
  again = fedlama.FedLAMAStage(model, fedlama.FedLAMAConfig(interval=2, phi=2))
  with pytest.raises(ValueError, match="distinct, non-empty keys"):
    FedAvgSSLProcess(model, SHAPE, SGD, CONFIG, stages=(lama, again))


def test_fedlama_takes_fedfoa_as_a_flag():
  config = ExperimentConfig(method="fedlama", ssl="byol", fedfoa=True, projector=(32, 16),
                            dataset="synthetic")
  assert config.fedfoa
  with pytest.raises(ValueError, match="--local_batch_size=8 is below the projection's n = 16"):
    ExperimentConfig(method="fedlama", ssl="byol", fedfoa=True, local_batch_size=8,
                     projector=(32, 16), dataset="synthetic")
