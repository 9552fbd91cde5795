"""FedFoA on top of a stateful FedSSL method (FedEMA here): the bank (updated by hand-checked rules,
held in the method state), the warm-up, which entries a client aligns to (never its own), what the
clients upload (the type signature), and both simulation modes giving the same rounds."""

import dataclasses

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_ssl import experiment
from tff_ssl.federated import client_state, common, fedfoa, fedssl
from tff_ssl.federated.fedavg import FedAvgSSLProcess
from tff_ssl.federated.grouping import Simulation
from tff_ssl.losses.feature_correlation import FeatureCorrelationConfig
from tests.federated.test_fedssl import BYOL, SGD, byol_model
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
  inner = fedssl.SiameseClientState(model.names, common.TensorMask.all(len(model.names)),
                                    fedssl.StatefulConfig(online_update="ema", ema_tau=0.7),
                                    ema_target=True)
  if fc is None:
    return FedAvgSSLProcess(model, SHAPE, SGD, BYOL, simulation=simulation, client_state=inner)
  return fedfoa.FedFoAProcess(model, SHAPE, SGD, dataclasses.replace(BYOL, feature_correlation=fc),
                              simulation=simulation,
                              client_state=fedfoa.FeatureCorrelationState(inner, fc, DIM))


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
  assert sorted(server[1].method_state["ids"].tolist()) == [0, 1, 2]
  # Round 1: clients 1 and 2 align to the two entries not their own, client 3 to all three.
  assert float(agg[1]["fedfoa_partners"]) == pytest.approx((2 + 2 + 3) / 3)
  assert float(agg[1]["fedfoa_term"]) > 0
  # After round 1 the bank holds 1, 2, 3 (0 evicted, the oldest); round 2: client 0 aligns to all
  # three, client 3 to 1 and 2.
  assert sorted(server[2].method_state["ids"].tolist()) == [1, 2, 3]
  assert float(agg[2]["fedfoa_partners"]) == pytest.approx((3 + 2) / 2)
  # Each published R is upper triangular with a non-negative diagonal; the bank holds them.
  for r in server[3].method_state["r"]:
    assert np.allclose(np.tril(r, -1), 0) and np.all(np.diag(r) >= 0) and np.trace(r) > 0


def test_same_rounds_in_both_simulation_modes(runs):
  (ref, ref_m), (grp, grp_m) = runs["reference"], runs["grouped"]
  for a, b in zip(ref[-1].weights, grp[-1].weights):
    np.testing.assert_allclose(a, b, atol=1e-5 * max(1.0, np.abs(a).max()))
  assert ref[-1].method_state["ids"].tolist() == grp[-1].method_state["ids"].tolist()
  np.testing.assert_allclose(ref[-1].method_state["r"], grp[-1].method_state["r"], rtol=1e-4,
                             atol=1e-5)
  for a, b in zip(ref_m, grp_m):
    assert float(a["aggregation"]["fedfoa_term"]) == pytest.approx(
        float(b["aggregation"]["fedfoa_term"]), rel=1e-4)


def test_the_term_changes_training_only_after_the_warmup(runs):
  base, _ = run(process_of(Simulation(group_size=2), fc=None))
  foa, _ = runs["grouped"]
  for a, b in zip(base[1].weights, foa[1].weights):  # Warm-up round: the base method exactly.
    np.testing.assert_array_equal(a, b)
  gap = max(np.abs(a - b).max() for a, b in zip(base[2].weights, foa[2].weights))
  assert gap > 1e-6


def test_clients_upload_their_update_and_r_only(runs):
  del runs
  for sim in (Simulation(mode="reference"), Simulation(group_size=2)):
    process = process_of(sim)
    sig = process.run_round.type_signature
    reports = sig.result.reports
    assert reports.placement is tff.SERVER
    assert list(reports.member._name_to_index) == ["client", "r", "term", "partners"]  # pylint: disable=protected-access
    assert reports.member.r.shape == (None, DIM, DIM)
    assert sig.parameter.ids.placement is tff.CLIENTS
    assert sig.parameter.context.placement is tff.SERVER
    assert sig.result.client_states.placement is tff.CLIENTS


def test_fedfoa_needs_batches_of_at_least_n_images():
  with pytest.raises(ValueError, match="--local_batch_size=8 is below the projection's n = 16"):
    experiment.ExperimentConfig(method="fedema", ssl="byol", fedfoa=True, local_batch_size=8,
                                projector=(32, 16), dataset="synthetic")
