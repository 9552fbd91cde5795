"""FedU²'s EUA (tff_ssl/methods/fedu2.py): the min-norm weights against an exact solution found
independently (every face of the simplex, its equality-constrained minimum, the least among the
feasible ones); the aggregate of hand-made updates; and a round whose server steps along EUA's
direction of the clients' own updates, each report a client's own update. FUR's loss:
tests/losses/test_uniformity.py; both from bin/train: tests/methods/test_contract.py."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tests.federated.test_round_anatomy import AUGMENT, SGD, SHAPE, clients_of, resnet
from tff_ssl import experiment
from tff_ssl.federated import client_state, client_work, common
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.grouping import Simulation
from tff_ssl.federated import fedavg_process, masks
from tff_ssl.methods import fedu2


def exact_min_norm(gram):
  """min over the simplex of x^T G x: on each face S, the minimum over {sum x_S = 1} from its KKT
  system; the least objective over the faces whose minimum is feasible (x >= 0)."""
  k = len(gram)
  best, best_x = np.inf, None
  for size in range(1, k + 1):
    for face in itertools.combinations(range(k), size):
      idx = list(face)
      system = np.zeros((size + 1, size + 1))
      system[:size, :size] = 2 * gram[np.ix_(idx, idx)]
      system[:size, size] = system[size, :size] = 1.0
      rhs = np.zeros(size + 1)
      rhs[size] = 1.0
      sol = np.linalg.lstsq(system, rhs, rcond=None)[0][:size]
      if sol.min() < -1e-12 or abs(sol.sum() - 1) > 1e-9:
        continue
      x = np.zeros(k)
      x[idx] = sol
      value = x @ gram @ x
      if value < best - 1e-15:
        best, best_x = value, x
  return best, best_x


@pytest.mark.parametrize("k,dim,seed", [(2, 5, 0), (4, 6, 1), (5, 3, 2), (6, 20, 3)])
def test_min_norm_weights_reach_the_exact_minimum(k, dim, seed):
  rng = np.random.default_rng(seed)
  g = rng.normal(size=(k, dim)) + (0.0 if seed % 2 else 1.5)  # Some with a shared direction.
  unit = g / np.linalg.norm(g, axis=1, keepdims=True)
  gram = unit @ unit.T
  start = rng.uniform(1, 5, size=k)
  lam = fedu2.min_norm_weights(gram, start / start.sum())
  best, best_x = exact_min_norm(gram)
  assert lam.min() >= 0 and abs(lam.sum() - 1) < 1e-12
  np.testing.assert_allclose(lam @ gram @ lam, best, rtol=1e-7, atol=1e-12)
  np.testing.assert_allclose(lam @ unit, best_x @ unit, atol=1e-6)  # The min-norm point is unique.


def test_two_clients_meet_halfway_whatever_their_sizes_and_lengths():
  # Two unit vectors: the nearest point to 0 on the segment between them is its midpoint.
  delta, lam = fedu2.unified_update(np.array([[3.0, 0.0], [1.0, 1.0]]), np.array([1.0, 9.0]))
  np.testing.assert_allclose(lam, [0.5, 0.5], atol=1e-9)
  np.testing.assert_allclose(delta, [0.5 + 0.5 / np.sqrt(2), 0.5 / np.sqrt(2)], atol=1e-9)
  # A client that did not move has no direction: weight 0, the others as without it.
  delta0, lam0 = fedu2.unified_update(np.array([[3.0, 0.0], [0.0, 0.0], [1.0, 1.0]]),
                                      np.array([1.0, 5.0, 9.0]))
  np.testing.assert_allclose(lam0, [0.5, 0.0, 0.5], atol=1e-9)
  np.testing.assert_allclose(delta0, delta, atol=1e-9)


def test_a_round_steps_along_the_unified_update_of_the_clients_own_updates():
  model = resnet()
  config = ClientConfig(ssl="simclr", client_learning_rate=0.05, augment=AUGMENT, seed=4)
  mask = masks.TensorMask.of_model(model)
  size = sum(int(np.prod(s.shape)) for s in model.weight_specs)
  ids = [0, 1, 2]
  # Grouped (the default): the reports come from the slots' clients one by one. bin/train runs it
  # too (tests/methods/test_contract.py).
  process = fedavg_process.FedAvgSSLProcess(model, SHAPE, SGD, config, simulation=Simulation(group_size=2),
                                    mask=mask, stages=(fedu2.UnifiedAggregation(size),))
  state = process.initialize()
  reports = process.compute_update(state, clients_of(ids), client_ids=ids)["reports"]["fedu2_eua"]
  new, metrics = process.next(state, clients_of(ids), client_ids=ids,
                              store=client_state.MemoryClientStateStore())
  want, lam = fedu2.unified_update(reports["update"], reports["examples"])
  step = np.concatenate([(a - b).ravel() for a, b in zip(state.weights, new.weights)])
  # Server SGD at rate 1 (momentum starts at 0): the weights moved by exactly EUA's update.
  np.testing.assert_allclose(step, want, atol=2e-6)
  assert metrics["aggregation"]["fedu2_eua_max_weight"] == pytest.approx(lam.max(), abs=1e-6)
  assert reports["examples"].tolist() == [4.0, 4.0, 4.0] and reports["update"].shape == (3, size)
  # Each report is that client's own update: client 1's local training alone.
  alone = client_work.local_training(model, config, [tf.constant(w) for w in state.weights],
                                     common.round_seed(config.seed, 0), clients_of([1])[0])[0]
  np.testing.assert_allclose(reports["update"][1],
                             np.concatenate([d.numpy().ravel() for d in alone]), rtol=1e-4,
                             atol=1e-6)


def test_eua_is_refused_where_a_method_cannot_add_it():
  with pytest.raises(ValueError, match="fedu2_eua"):
    experiment.ExperimentConfig(method="fedlama", ssl="simclr").check_fields_for_method(
        {"fedu2_eua"})


def test_eua_refuses_a_strategy_or_compression_it_would_ignore():
  with pytest.raises(ValueError, match="--aggregator=ldawa would have no effect"):
    experiment.ExperimentConfig(method="fedavg", ssl="simclr", fedu2_eua=True, aggregator="ldawa")
  with pytest.raises(ValueError, match="--compression=quantize8 would have no effect"):
    experiment.ExperimentConfig(method="fedavg", ssl="simclr", fedu2_eua=True,
                                compression="quantize8", simulation="reference")
