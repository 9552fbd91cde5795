"""FedFoA on top of a stateful FedSSL method (FedEMA here): the bank (updated by hand-checked rules,
held in the method state), the warm-up, which entries a client aligns to (never its own), what the
clients upload (the type signature), and both simulation modes giving the same rounds."""

import dataclasses

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_ssl import experiment
from tff_ssl.federated import client_state
from tff_ssl.federated import masks
from tff_ssl.methods import fedema, fedfoa, fedssl, heterogeneous
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.grouping import Simulation
from tff_ssl.methods.fedfoa import FeatureCorrelationConfig
from tests import spread
from tests.methods.test_fedssl import BYOL, SGD, byol_model
from tests.federated.test_round_anatomy import SHAPE, clients_of

DIM = 8  # byol_model's projection.
ROUNDS = [[0, 1, 2], [1, 2, 3], [0, 3]]
# Every valid entry (not the trace test), so the partner counts are known: warm-up of one round.
FC = FeatureCorrelationConfig(warmup=1, bank_size=3, select="all")


def test_bank_keeps_each_clients_newest_first_in_first_out():
  config = FeatureCorrelationConfig(bank_size=3)
  bank = fedfoa.empty_bank(config, 1)
  r = lambda *v: np.array(v, np.float32).reshape(-1, 1, 1)  # noqa: E731
  bank = fedfoa.update_bank(bank, [7, 8], r(1, 2), config)
  assert bank["ids"].tolist() == [7, 8, fedfoa.EMPTY] and bank["stamp"].tolist() == [0, 1, -1]
  bank = fedfoa.update_bank(bank, [8, 9], r(3, 4), config)  # 8 in place, 9 the empty slot.
  assert bank["ids"].tolist() == [7, 8, 9] and bank["r"].ravel().tolist() == [1, 3, 4]
  bank = fedfoa.update_bank(bank, [5], r(5), config)  # Evicts 7 (written longest ago).
  assert bank["ids"].tolist() == [5, 8, 9] and bank["stamp"].tolist() == [4, 2, 3]
  # More new clients than slots: the last reported stay.
  bank = fedfoa.update_bank(bank, [1, 2, 3, 4], r(6, 7, 8, 9), config)
  assert bank["ids"].tolist() == [3, 4, 2] and bank["r"].ravel().tolist() == [8, 9, 7]
  merged = FeatureCorrelationConfig(bank="merged")
  bank = fedfoa.update_bank(fedfoa.empty_bank(merged, 1), [1, 2], r(2, 4), merged)
  assert bank["ids"].tolist() == [fedfoa.MERGED] and bank["r"].ravel().tolist() == [3.0]


def process_of(simulation, fc=FC):
  model = byol_model()
  inner = fedssl.SiameseClientState(model.names, masks.TensorMask.all(len(model.names)),
                                    fedssl.StatefulConfig(fedema.Update(ema_tau=0.7)),
                                    ema_target=True)
  if fc is None:
    return FedAvgSSLProcess(model, SHAPE, SGD, BYOL, simulation=simulation, client_state=inner)
  return FedAvgSSLProcess(model, SHAPE, SGD, BYOL, simulation=simulation, client_state=inner,
                          stages=(fedfoa.FedFoAStage(fc, DIM),))


def run(process):
  store = client_state.MemoryClientStateStore()
  server, metrics = [process.initialize()], []
  for ids in ROUNDS:
    state, m = process.next(server[-1], clients_of(ids, n=DIM), client_ids=ids, store=store)
    server.append(state)
    metrics.append(m)
  return server, metrics


@pytest.fixture(scope="module")
def runs():
  return {mode: run(process_of(sim)) for mode, sim in (
      ("reference", Simulation(mode="reference")), ("grouped", Simulation(group_size=2)))}


def test_bank_warmup_and_partners_never_the_client_itself(runs):
  server, metrics = runs["grouped"]
  agg = [m["aggregation"] for m in metrics]
  # Round 0 is the warm-up: no term; the bank then holds clients 0, 1, 2.
  assert float(agg[0]["fedfoa_partners"]) == 0 and float(agg[0]["fedfoa_term"]) == 0
  assert sorted(server[1].method_state[fedfoa.KEY]["ids"].tolist()) == [0, 1, 2]
  # Round 1: clients 1 and 2 align to the two entries not their own, client 3 to all three.
  assert float(agg[1]["fedfoa_partners"]) == pytest.approx((2 + 2 + 3) / 3)
  assert float(agg[1]["fedfoa_term"]) > 0
  # After round 1 the bank holds 1, 2, 3 (0 evicted, the oldest); round 2: client 0 aligns to all
  # three, client 3 to 1 and 2.
  assert sorted(server[2].method_state[fedfoa.KEY]["ids"].tolist()) == [1, 2, 3]
  assert float(agg[2]["fedfoa_partners"]) == pytest.approx((3 + 2) / 2)
  # Each published R is upper triangular with a non-negative diagonal; the bank holds them.
  for r in server[3].method_state[fedfoa.KEY]["r"]:
    assert np.allclose(np.tril(r, -1), 0) and np.all(np.diag(r) >= 0) and np.trace(r) > 0


def test_same_rounds_in_both_simulation_modes(runs):
  (ref, ref_m), (grp, grp_m) = runs["reference"], runs["grouped"]
  # Three rounds apart, not re-anchored: largest relative gap seen 0 (four oneDNN
  # set-ups).
  spread.within("FedFoA weights after 3 rounds, grouped vs reference",
                spread.relative_gap(grp[-1].weights, ref[-1].weights,
                                    max(1.0, max(np.abs(a).max() for a in ref[-1].weights))), 1e-5)
  ref_bank, grp_bank = ref[-1].method_state[fedfoa.KEY], grp[-1].method_state[fedfoa.KEY]
  assert ref_bank["ids"].tolist() == grp_bank["ids"].tolist()
  np.testing.assert_allclose(ref_bank["r"], grp_bank["r"], rtol=1e-4,
                             atol=1e-5)
  for a, b in zip(ref_m, grp_m):
    assert float(a["aggregation"]["fedfoa_term"]) == pytest.approx(
        float(b["aggregation"]["fedfoa_term"]), rel=1e-4)


def test_the_term_changes_training_only_after_the_warmup(runs):
  base, _ = run(process_of(Simulation(group_size=2), fc=None))
  foa, _ = runs["grouped"]
  # Warm-up round: the base method, up to the round-off of another graph (FedFoA's adds the term's
  # ops beside the same loss): largest relative gap seen 0 (four oneDNN set-ups). After it, the term moves
  # the weights far more than that.
  bound = 1e-5
  spread.within("warm-up round, FedFoA vs the base method",
                spread.relative_gap(foa[1].weights, base[1].weights), bound)
  assert spread.relative_gap(foa[2].weights, base[2].weights) > 100 * bound


def test_clients_upload_their_update_and_r_only(runs):
  del runs
  for sim in (Simulation(mode="reference"), Simulation(group_size=2)):
    process = process_of(sim)
    sig = process.run_round.type_signature
    reports = sig.result.reports
    assert reports.placement is tff.SERVER
    assert list(reports.member._name_to_index) == ["client", "fedfoa"]  # pylint: disable=protected-access
    assert list(reports.member.fedfoa._name_to_index) == ["r", "term", "partners"]  # pylint: disable=protected-access
    assert reports.member.fedfoa.r.shape == (None, DIM, DIM)
    assert sig.parameter.ids.placement is tff.CLIENTS
    assert sig.parameter.context.placement is tff.SERVER
    assert sig.result.client_states.placement is tff.CLIENTS


def test_fedfoa_needs_batches_of_at_least_n_images():
  with pytest.raises(ValueError, match="--local_batch_size=8 is below the projection's n = 16"):
    experiment.ExperimentConfig(method="fedema", ssl="byol", fedfoa=True, local_batch_size=8,
                                projector=(32, 16), dataset="synthetic")


# --- Heterogeneous clients --------------------------------------------------------------------------

HETERO_ROUNDS = [[0, 1, 2, 3], [2, 1, 0, 3]]
HFC = dataclasses.replace(FC, bank_size=4)


def hetero_process(simulation, fc=HFC, architectures=("resnet8", "vgg9")):
  config = experiment.ExperimentConfig(
      method="heterogeneous", ssl="byol", dataset="synthetic", architectures=architectures,
      width=0.25, projector=(DIM,), predictor=(16, DIM), num_clients=4, clients_per_round=4,
      client_learning_rate=0.05, fedfoa=fc is not None, seed=3)
  fedavg_config = dataclasses.replace(BYOL, seed=3)
  return heterogeneous.HeterogeneousProcess(
      heterogeneous.models_of(config, SHAPE), list(architectures), SHAPE, fedavg_config,
      simulation, () if fc is None else (fedfoa.FedFoAStage(fc, DIM),))


def hetero_run(process):
  store = client_state.MemoryClientStateStore()
  server, metrics = [process.initialize()], []
  for ids in HETERO_ROUNDS:
    state, m = process.next(server[-1], clients_of(ids, n=DIM), client_ids=ids, store=store)
    server.append(state)
    metrics.append(m)
  return server, metrics, store


@pytest.fixture(scope="module")
def hetero_runs():
  return {"reference": hetero_run(hetero_process(Simulation(mode="reference"))),
          "grouped": hetero_run(hetero_process(Simulation(group_size=1))),
          "alone": hetero_run(hetero_process(Simulation(), fc=None))}


def test_heterogeneous_clients_align_to_every_other_client_after_the_warmup(hetero_runs):
  server, metrics, store = hetero_runs["grouped"]
  agg = [m["aggregation"] for m in metrics]
  assert float(agg[0]["fedfoa_partners"]) == 0
  assert float(agg[1]["fedfoa_partners"]) == 3  # The bank holds all four; never one's own.
  assert sorted(server[-1].method_state[fedfoa.KEY]["ids"].tolist()) == [0, 1, 2, 3]
  assert set(agg[1]) >= {"loss_resnet8", "loss_vgg9"}
  assert server[-1].weights == []  # No global model.
  # Each client trained its own architecture's model: client 0 and 2 share resnet8's shapes.
  states = store.read([0, 1, 2], 2, None)
  assert [w.shape for w in states[0]["online"]] == [w.shape for w in states[2]["online"]]
  assert [w.shape for w in states[0]["online"]] != [w.shape for w in states[1]["online"]]


def test_heterogeneous_same_rounds_in_both_simulation_modes_and_alone_until_the_warmup_ends(
    hetero_runs):
  ref, grp, alone = (hetero_runs[k][2] for k in ("reference", "grouped", "alone"))
  for cid in range(4):
    for a, b in zip(ref.read([cid], 2, None)[0]["online"], grp.read([cid], 2, None)[0]["online"]):
      np.testing.assert_allclose(a, b, atol=1e-5 * max(1.0, np.abs(a).max()))
    # Round 0 is the warm-up: FedFoA's clients trained as alone, up to the round-off of another
    # graph and simulation mode (largest relative gap seen 0, four oneDNN set-ups).
    spread.within("warm-up round, heterogeneous FedFoA vs alone",
                  spread.relative_gap(grp.read([cid], 1, None)[0]["online"],
                                      alone.read([cid], 1, None)[0]["online"]), 1e-5)
  # After it, the term moves training: 9.7e-4 here (ResNet-8 and VGG-9), 100 times the warm-up's bound.
  assert spread.relative_gap(grp.read([0], 2, None)[0]["online"],
                             alone.read([0], 2, None)[0]["online"]) > 1e-4


def test_heterogeneous_type_signatures_show_no_weights_leave_a_client():
  f32, i64, k = np.float32, np.int64, HFC.bank_size
  # Everything at the SERVER, in and out: the seed and FedFoA's bank (bank, its ids, warm-up flag);
  # the mean loss, the example count and each client's (id, R_bar, term, partners). Weights only
  # ever appear in `client_states`, placed at the CLIENTS.
  want = {True: [(i64, (2,)), (f32, (k, DIM, DIM)), (i64, (k,)), (f32, ()),
                 (f32, ()), (f32, ()),
                 (i64, (None,)), (f32, (None, DIM, DIM)), (f32, (None,)), (f32, (None,))],
          False: [(i64, (2,)), (f32, ()), (f32, ())]}
  for fc in (HFC, None):
    process = hetero_process(Simulation(group_size=1), fc)
    for run_round in process.round_of:
      sig = run_round.type_signature
      server_parts = [p for p in sig.parameter if p.placement is tff.SERVER] + [
          r for r in sig.result if r.placement is tff.SERVER]
      leaves = [leaf for part in server_parts for leaf in _leaf_types(part.member)]
      assert leaves == want[fc is not None], leaves
      assert sig.result.client_states.placement is tff.CLIENTS
      assert [n for n, _ in tff.structure.iter_elements(sig.result)] == (
          ["loss", "examples", "client_states"] + (["reports"] if fc else []))


def _leaf_types(t):
  if isinstance(t, tff.TensorType):
    return [(np.dtype(t.dtype).type, tuple(t.shape))]
  return [leaf for _, member in tff.structure.iter_elements(t) for leaf in _leaf_types(member)]


def test_config_errors_name_the_value():
  with pytest.raises(ValueError, match="fedfoa_norm 'spectral'"):
    FeatureCorrelationConfig(norm="spectral")
  with pytest.raises(ValueError, match="fedfoa_bank_size must be >= 1; got 0"):
    FeatureCorrelationConfig(bank_size=0)
  assert FeatureCorrelationConfig(bank="merged").capacity == 1
