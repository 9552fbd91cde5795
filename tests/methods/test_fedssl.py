"""Stateful FedSSL clients (FedBYOL, FedU, FedEMA, FedMoCo): FedEMA's mu and the autoscaler's lambda_k by
hand, FedBYOL's target network kept out of aggregation, FedMoCo's queue kept across rounds, and both
simulation modes giving the same rounds."""

import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import models
from tff_ssl.federated import client_state, common
from tff_ssl.federated import masks
from tff_ssl.methods import fedema, fedssl, fedu
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.ssl import Hparams
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.grouping import Simulation
from tests.federated.test_round_anatomy import AUGMENT, SHAPE, clients_of, resnet
from tests import spread

# --- FedEMA's start of a round, by hand -------------------------------------------------------------

NAMES = ["encoder/conv1/kernel", "projector/dense/kernel", "predictor/dense/kernel"]


class Specs:  # What `spec` needs of a model.
  weight_specs = [tf.TensorSpec([2], tf.float32)] * 3


def hand_state(config):
  return fedssl.SiameseClientState(NAMES, masks.TensorMask.all(3), config, ema_target=False)


def as_tf(xs):
  return [tf.constant(x, tf.float32) for x in xs]


def play(state_lib, rounds):
  """Runs `begin`/`end` for one client over `rounds` of (global weights, its network after local
  training; None: no change from where it started): returns the start weights and the state after
  each round."""
  state = state_lib.initial(Specs())
  starts, states = [], []
  for weights, trained in rounds:
    start = [s.numpy() for s in state_lib.begin(state, as_tf(weights))]
    trained = start if trained is None else trained
    upload = [np.subtract(w, t) for w, t in zip(weights, trained)]  # Relative to the broadcast.
    state = state_lib.end(state, as_tf(weights), as_tf(upload), 1.0, 0.0)
    starts.append(start)
    states.append(state)
  return starts, states


# Round 0: global G0, the client trains to W0. Round 1: global G1.
G0 = [[1.0, 1.0], [1.0, 0.0], [0.0, 2.0]]
W0 = [[0.5, 1.0], [1.0, -0.5], [-1.0, 1.0]]


def test_fedema_mu_by_hand_for_two_clients_and_two_rounds():
  # Client A: G1 - W0 over the online encoder (conv + projector, not the predictor) is
  # [0.3, 0] and [0, 0.4]: d = 0.5, mu = min(0.8 * 0.5, 1) = 0.4.
  g1_a = [[0.8, 1.0], [1.0, -0.1], [3.0, 3.0]]
  starts, states = play(hand_state(fedssl.StatefulConfig(fedema.Update(ema_lambda=0.8))),
                        [(G0, W0), (g1_a, None)])
  np.testing.assert_allclose(starts[0], G0)  # A new client starts from the global model.
  assert float(states[0]["mu"]) == 0.0
  np.testing.assert_allclose(float(states[1]["divergence"]), 0.5, rtol=1e-6)
  np.testing.assert_allclose(float(states[1]["mu"]), 0.4, rtol=1e-6)
  want = [0.4 * np.asarray(w) + 0.6 * np.asarray(g) for w, g in zip(W0, g1_a)]
  np.testing.assert_allclose(starts[1], want, rtol=1e-6)  # Predictor mixed with the same mu.
  # Client B: d = ||[1.5, 0], [0, 2]|| = 2.5, mu = min(0.8 * 2.5, 1) = 1: it keeps its own network.
  g1_b = [[2.0, 1.0], [1.0, 1.5], [0.0, 0.0]]
  starts, states = play(hand_state(fedssl.StatefulConfig(fedema.Update(ema_lambda=0.8))),
                        [(G0, W0), (g1_b, None)])
  np.testing.assert_allclose(float(states[1]["mu"]), 1.0)
  np.testing.assert_allclose(starts[1], W0, rtol=1e-6)


def test_fedema_autoscaler_fixes_lambda_at_the_first_known_divergence():
  g1 = [[0.8, 1.0], [1.0, -0.1], [3.0, 3.0]]  # d = 0.5 (above): lambda_k = 0.7 / 0.5 = 1.4.
  # Round 2: the client's own network after round 1 is where it started (no local change); G2 minus
  # it has norm 0.25 over the online encoder: mu = min(1.4 * 0.25, 1) = 0.35.
  start1 = [0.7 * np.asarray(w) + 0.3 * np.asarray(g) for w, g in zip(W0, g1)]
  g2 = [start1[0] + [0.15, 0.0], start1[1] + [0.0, -0.2], [9.0, 9.0]]
  starts, states = play(hand_state(fedssl.StatefulConfig(fedema.Update(ema_tau=0.7))),
                        [(G0, W0), (g1, None), (g2, None)])
  assert float(states[0]["scale"]) == 0.0  # Not known at the first participation.
  np.testing.assert_allclose(float(states[1]["scale"]), 1.4, rtol=1e-6)
  np.testing.assert_allclose(float(states[1]["mu"]), 0.7, rtol=1e-6)  # mu = tau when it is set.
  np.testing.assert_allclose(starts[1], start1, rtol=1e-6)
  np.testing.assert_allclose(float(states[2]["scale"]), 1.4, rtol=1e-6)  # Fixed.
  np.testing.assert_allclose(float(states[2]["mu"]), 0.35, rtol=1e-5)


def test_fedu_keeps_its_predictor_only_when_diverged():
  near = [[0.8, 1.0], [1.0, -0.1], [3.0, 3.0]]  # d = 0.5 over the online encoder.
  for threshold, kept in ((0.6, False), (0.4, True)):
    starts, states = play(hand_state(fedssl.StatefulConfig(fedu.Update(threshold))),
                          [(G0, W0), (near, None)])
    np.testing.assert_allclose(starts[1][:2], near[:2])  # The encoder is always the global one.
    np.testing.assert_allclose(starts[1][2], W0[2] if kept else near[2])
    assert float(states[1]["mu"]) == float(kept)


def test_fedu_without_a_predictor_keeps_its_projector():
  # SimCLR / Barlow Twins (L-DAWA's FedU rows): the projector is the head; d is the ResNet's alone:
  # G1 - W0 over the conv tensor is [0.3, 0], d = 0.3.
  names, g1 = NAMES[:2], [[0.8, 1.0], [5.0, 5.0]]
  for threshold, kept in ((0.35, False), (0.25, True)):
    config = fedssl.StatefulConfig(fedu.Update(threshold))
    state_lib = fedssl.SiameseClientState(names, masks.TensorMask.all(2), config, ema_target=False)

    class Two:
      weight_specs = Specs.weight_specs[:2]

    state = state_lib.initial(Two())
    state = state_lib.end(state, as_tf(G0[:2]), as_tf([np.subtract(g, w) for g, w in
                                                       zip(G0[:2], W0[:2])]), 1.0, 0.0)
    start = [s.numpy() for s in state_lib.begin(state, as_tf(g1))]
    np.testing.assert_allclose(start[0], g1[0])
    np.testing.assert_allclose(start[1], W0[1] if kept else g1[1])
    np.testing.assert_allclose(float(state_lib.end(state, as_tf(g1), as_tf([[0, 0]] * 2), 1.0,
                                                   0.0)["divergence"]), 0.3, rtol=1e-6)


def test_bad_stateful_settings_name_the_value():
  with pytest.raises(ValueError, match="fedema_tau must be in"):
    fedema.Update(ema_tau=1.5)
  with pytest.raises(ValueError, match="unknown divergence_measure 'l1'"):
    fedssl.StatefulConfig(divergence="l1")


# --- Whole rounds -----------------------------------------------------------------------------------

BYOL = ClientConfig(ssl="byol", client_learning_rate=0.05, hparams=Hparams(target_decay=0.9),
                    augment=AUGMENT, seed=3)
SGD = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
ROUNDS = [[0, 1, 2], [1, 2], [0, 2]]  # Client ids of rounds 0, 1, 2.


def build_byol():
  enc = models.build_encoder("resnet8", SHAPE, width=0.25, name="encoder")
  x = tf.keras.Input(SHAPE)
  z = models.build_mlp_head(enc.output_shape[-1], [16, 8], name="projector")(enc(x))
  return tf.keras.Model(x, [z, models.build_mlp_head(8, [16, 8], name="predictor")(z)])


@functools.lru_cache(maxsize=None)
def byol_model():
  tf.keras.utils.set_random_seed(5)
  return FunctionalModel(build_byol)


def process_of(stateful, simulation):
  model = byol_model()
  state = fedssl.SiameseClientState(model.names, masks.TensorMask.all(len(model.names)),
                                    stateful, ema_target=True)
  return FedAvgSSLProcess(model, SHAPE, SGD, BYOL, simulation=simulation, client_state=state)


def run(process):
  """(server states, the client-state store, each round's aggregation measurements)."""
  store = client_state.MemoryClientStateStore()
  server, measured = [process.initialize()], []
  for ids in ROUNDS:
    state, metrics = process.next(server[-1], clients_of(ids), client_ids=ids, store=store)
    server.append(state)
    measured.append(metrics["aggregation"])
  return server, store, measured


@pytest.fixture(scope="module")
def fedema_runs():
  stateful = fedssl.StatefulConfig(fedema.Update(ema_tau=0.7))
  return {mode: run(process_of(stateful, sim)) for mode, sim in (
      ("reference", Simulation(mode="reference")), ("grouped", Simulation(group_size=2)))}


def flat(x):
  return [np.asarray(t) for t in tf.nest.flatten(x)]


def test_fedema_rounds_are_the_same_in_both_simulation_modes(fedema_runs):
  (ref, ref_store, _), (grp, grp_store, _) = fedema_runs["reference"], fedema_runs["grouped"]
  # Three rounds apart, not re-anchored: largest relative gaps seen 0 (weights) and 0 (client
  # states, relative to max(1, the largest entry)) in four oneDNN set-ups.
  spread.within("FedEMA weights after 3 rounds, grouped vs reference",
                spread.relative_gap(grp[-1].weights, ref[-1].weights), 1e-5)
  initial = ref_store.read([0], 0, None)[0]
  for cid in (0, 1, 2):
    a, b = flat(ref_store.read([cid], 3, initial)[0]), flat(grp_store.read([cid], 3, initial)[0])
    spread.within("FedEMA client states after 3 rounds, grouped vs reference",
                  spread.relative_gap(b, a, max(1.0, max(np.abs(x).max() for x in a))), 1e-5)


def test_fedema_mu_in_whole_rounds_matches_numpy(fedema_runs):
  """Each client's mu, recomputed in NumPy from its stored network and the server's weights; the
  round's aggregation.csv columns are their means over its returning clients."""
  server, store, measured = fedema_runs["reference"]
  model = byol_model()
  encoder = [i for i, n in enumerate(model.names) if not n.startswith("predictor/")]
  scale = {}
  for r, ids in enumerate(ROUNDS):
    mus, ds = [], []
    for cid in ids:
      before = store.read([cid], r, None)[0]
      after = store.read([cid], r + 1, None)[0]
      if before is None:  # First participation: starts from the global model.
        assert float(after["mu"]) == 0.0 and float(after["scale"]) == 0.0
        continue
      d = np.sqrt(sum(np.sum((server[r].weights[i] - np.asarray(before["online"][i])) ** 2)
                      for i in encoder))
      scale.setdefault(cid, 0.7 / d)  # Set at the first round where d is known, then fixed.
      np.testing.assert_allclose(float(after["scale"]), scale[cid], rtol=1e-5)
      np.testing.assert_allclose(float(after["mu"]), min(scale[cid] * d, 1.0), rtol=1e-5)
      mus.append(min(scale[cid] * d, 1.0))
      ds.append(d)
    if not mus:  # No client had a network of its own yet.
      assert np.isnan(measured[r]["client_own_weight"])
      assert np.isnan(measured[r]["client_divergence"])
    else:
      np.testing.assert_allclose(measured[r]["client_own_weight"], np.mean(mus), rtol=1e-5)
      np.testing.assert_allclose(measured[r]["client_divergence"], np.mean(ds), rtol=1e-5)
  assert len(scale) == 3  # Every client came back at least once.


def test_fedbyol_target_is_the_clients_own_ema_never_the_aggregate():
  """Client 0 takes part in rounds 0 and 2. Its target after round 2 is its own target after round 0
  moved by the EMA of its round-2 local step (decay 0.9): nothing of the aggregation enters it but the
  online network it trained from the broadcast model."""
  process = process_of(fedssl.StatefulConfig(), Simulation(mode="reference"))
  server, store, _ = run(process)
  t0 = flat(store.read([0], 1, None)[0]["target"])
  t2 = flat(store.read([0], 3, None)[0]["target"])
  state = store.read([0], 2, None)[0]
  assert float(state["rounds"]) == 1.0
  seed = common.round_seed(BYOL.seed, 2)
  out = process.client_update(common.flat_weights(server[2].weights), seed, clients_of([0])[0],
                              {"states": state})
  trained = [w - u for w, u in zip(server[2].weights, out[0])]
  for a, b, w in zip(t2, t0, trained):
    np.testing.assert_allclose(a, 0.9 * b + 0.1 * w, atol=1e-6 * max(1.0, np.abs(a).max()))
  # ...which is not the global model (FedAvg-style BYOL would restart its target there).
  assert max(np.abs(a - g).max() for a, g in zip(t2, server[3].weights)) > 1e-3
  assert max(np.abs(a - g).max() for a, g in zip(t0, server[2].weights)) > 1e-4


def test_fedmoco_keeps_its_momentum_network_and_queue_across_rounds():
  """Client 0 (rounds 0 and 2, 4 images, one full-batch step a round): its queue after round 2 is
  round 2's 4 keys in front of its queue after round 0 (not a fresh zero queue), and its momentum
  network moved by its own EMA only."""
  model = resnet()
  cfg = ClientConfig(ssl="moco", client_learning_rate=0.05, augment=AUGMENT, seed=3,
                     hparams=Hparams(target_decay=0.9, moco_queue=12, temperature=0.2))
  state_lib = fedssl.SiameseClientState(model.names, masks.TensorMask.all(len(model.names)),
                                        fedssl.StatefulConfig(), ema_target=True, queue_size=12)
  process = FedAvgSSLProcess(model, SHAPE, SGD, cfg, simulation=Simulation(group_size=2),
                             client_state=state_lib)
  server, store, _ = run(process)
  after0, before2, after2 = (store.read([0], r, None)[0] for r in (1, 2, 3))
  q0, q2 = np.asarray(after0["queue"]), np.asarray(after2["queue"])
  assert q0.shape == (12, model.output_dims[0])
  np.testing.assert_allclose(np.linalg.norm(q0[:4], axis=1), 1.0, rtol=1e-5)  # Round 0's keys.
  assert not q0[4:].any()  # The rest still the initial zeros.
  np.testing.assert_array_equal(q2[4:], q0[:-4])
  np.testing.assert_allclose(np.linalg.norm(q2[:4], axis=1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(before2["queue"]), q0)  # Round 1 left it alone.
  # The momentum network: t2 = 0.9 t0 + 0.1 (its trained online network of round 2).
  reference = FedAvgSSLProcess(model, SHAPE, SGD, cfg, simulation=Simulation(mode="reference"),
                               client_state=state_lib)
  out = reference.client_update(common.flat_weights(server[2].weights),
                                common.round_seed(cfg.seed, 2),
                                clients_of([0])[0], {"states": before2})
  trained = [w - u for w, u in zip(server[2].weights, out[0])]
  # The stored target comes from a grouped run, `trained` from the reference client's update:
  # largest gap seen 0 in four oneDNN set-ups, relative to max(1, the largest weight).
  target = flat(after2["target"])
  spread.within("FedMoCo momentum network, grouped store vs reference client update",
                spread.relative_gap(target, [0.9 * b + 0.1 * w for b, w in
                                             zip(flat(after0["target"]), trained)],
                                    max(1.0, max(np.abs(a).max() for a in target))), 1e-5)
