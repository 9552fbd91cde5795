"""The shared round anatomy: client state (in both simulation modes, on disk), method-owned server
state, and training part of a model (a tensor mask)."""

import asyncio
import collections
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import models
from tff_ssl.data import AugmentConfig
from tff_ssl.federated import client_state, common
from tff_ssl.federated import masks
from tff_ssl.federated import server_step
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.grouping import Simulation
from tests.federated import toy_stateful
from tests import spread

SHAPE = (12, 12, 1)
AUGMENT = AugmentConfig(crop_scale=(0.5, 1.0), blur=False)
CONFIG = ClientConfig(ssl="simclr", client_learning_rate=0.05, augment=AUGMENT, seed=4)
SGD = tff.learning.optimizers.build_sgdm(learning_rate=1.0)


def build_resnet():
  enc = models.build_encoder("resnet8", SHAPE, width=0.25, name="encoder")
  x = tf.keras.Input(SHAPE)
  return tf.keras.Model(x, models.build_mlp_head(enc.output_shape[-1], [16, 8])(enc(x)))


@functools.lru_cache(maxsize=None)
def resnet():
  tf.keras.utils.set_random_seed(2)
  return FunctionalModel(build_resnet)


def clients_of(ids, n=4):
  """Client `c` always holds the same `n` images (seeded by c)."""
  out = []
  for c in ids:
    rng = np.random.default_rng(c)
    out.append(common.client_inputs(rng.integers(0, 256, (n,) + SHAPE, dtype=np.uint8),
                                    np.arange(100 * c, 100 * c + n)))
  return out


ROUNDS = [[0, 1, 2], [1, 3], [0, 3]]  # Client ids sampled in rounds 0, 1, 2.


def run_rounds(process, store, rounds=ROUNDS):
  state = process.initialize()
  states = [state]
  for ids in rounds:
    state, _ = process.next(state, clients_of(ids), client_ids=ids, store=store)
    states.append(state)
  return states


@pytest.fixture(scope="module")
def toy_runs():
  model = resnet()
  out = {}
  for name, simulation in (("reference", Simulation(mode="reference")),
                           ("grouped", Simulation(group_size=2))):
    store = client_state.MemoryClientStateStore()
    process = FedAvgSSLProcess(model, SHAPE, SGD, CONFIG, simulation=simulation,
                               client_state=toy_stateful.CounterAndMeanUpdate())
    out[name] = (process, store, run_rounds(process, store))
  return out


def test_client_state_survives_rounds_and_only_sampled_clients_change(toy_runs):
  process, store, server_states = toy_runs["reference"]
  model = resnet()
  initial = process._initial_client_state  # pylint: disable=protected-access
  assert store.clients() == [0, 1, 2, 3]  # Only clients that took part have a state.
  counts = {c: float(store.read([c], 3, initial)[0]["count"]) for c in range(5)}
  assert counts == {0: 2.0, 1: 2.0, 2: 1.0, 3: 2.0, 4: 0.0}
  # Client 2 took part in round 0 only: its state as of every later round is round 0's.
  assert float(store.read([2], 1, initial)[0]["count"]) == 1.0
  assert float(store.read([1], 1, initial)[0]["count"]) == 1.0  # Before its second round.
  # The running mean is the mean of the client's uploads, each computed independently by a stateless
  # process from the global model of that round.
  stateless = FedAvgSSLProcess(model, SHAPE, SGD, CONFIG, simulation=Simulation(mode="reference"))
  uploads = collections.defaultdict(list)
  for r, ids in enumerate(ROUNDS):
    for c, data in zip(ids, clients_of(ids)):
      delta = stateless.client_update(common.flat_weights(server_states[r].weights),
                                      common.round_seed(CONFIG.seed, r), data)[0]
      uploads[c].append([np.asarray(d) for d in delta])
  for c in range(4):
    got = store.read([c], 3, initial)[0]["mean_update"]
    want = [np.mean(parts, axis=0) for parts in zip(*uploads[c])]
    scale = max(np.abs(w).max() for w in want)
    assert max(np.abs(np.asarray(g) - w).max() for g, w in zip(got, want)) <= 1e-5 * scale


def test_client_state_is_the_same_in_both_simulation_modes(toy_runs):
  ref_process, ref_store, ref_states = toy_runs["reference"]
  _, grouped_store, grouped_states = toy_runs["grouped"]
  initial = ref_process._initial_client_state  # pylint: disable=protected-access
  for c in range(4):
    a, b = ref_store.read([c], 3, initial)[0], grouped_store.read([c], 3, initial)[0]
    assert float(a["count"]) == float(b["count"])
    # Three rounds apart, not re-anchored: largest gaps seen 0 (client state, relative) and 0
    # (weights, absolute) in four oneDNN set-ups.
    spread.within("client state after 3 rounds, grouped vs reference",
                  spread.relative_gap(b["mean_update"], a["mean_update"]), 1e-4)
  spread.within("weights after 3 rounds, grouped vs reference",
                spread.relative_gap(grouped_states[-1].weights, ref_states[-1].weights, 1.0), 1e-5)


def test_stateful_process_types_carry_the_state_at_clients(toy_runs):
  for name, (process, _, _) in toy_runs.items():
    sig = process.run_round.type_signature
    state_param = sig.parameter.states
    assert state_param.placement is tff.CLIENTS
    assert sig.result.client_states.placement is tff.CLIENTS
    count = state_param.member.count
    assert count.shape == ((None,) if name == "grouped" else ())


def test_stateful_process_needs_ids_and_a_store():
  process = FedAvgSSLProcess(resnet(), SHAPE, SGD, CONFIG, simulation=Simulation(mode="reference"),
                             client_state=toy_stateful.CounterAndMeanUpdate())
  with pytest.raises(ValueError, match="needs the clients' ids"):
    process.next(process.initialize(), clients_of([0, 1]))


def test_disk_store_versions_rollback_and_prune(tmp_path):
  store = client_state.DiskClientStateStore(str(tmp_path / "states"))
  initial = {"x": np.zeros(2, np.float32)}
  value = lambda v: {"x": np.full(2, v, np.float32)}  # noqa: E731
  store.write([0, 1], [value(1), value(2)], round_num=0)  # Version 1.
  store.write([1], [value(3)], round_num=1)  # Version 2.
  store.write([0, 5], [value(4), value(5)], round_num=2)  # Version 3.
  read = lambda cid, r: float(store.read([cid], r, initial)[0]["x"][0])  # noqa: E731
  assert [read(0, r) for r in range(4)] == [0.0, 1.0, 1.0, 4.0]
  assert [read(1, r) for r in range(4)] == [0.0, 2.0, 3.0, 3.0]
  assert store.clients() == [0, 1, 5]
  # Resuming from the checkpoint after 2 rounds forgets round 2's writes.
  store.rollback(2)
  assert [read(0, 3), read(5, 3), read(1, 3)] == [1.0, 0.0, 3.0]
  assert store.clients() == [0, 1]
  # With the oldest kept checkpoint at 2 rounds, client 1's version 1 can no longer be needed.
  store.prune(2)
  assert sorted(p.name for p in (tmp_path / "states" / "0" / "1").iterdir()) == ["2.npz"]
  assert read(1, 2) == 3.0 and read(0, 2) == 1.0
  assert store.disk_bytes() > 0


def test_mask_trains_only_the_last_block(tmp_path):
  del tmp_path
  model = resnet()
  mask = masks.TensorMask.from_names(model.names, lambda n: "stage3_block1" in n)
  trained = set(mask.indices)
  assert 0 < len(trained) < len(model.names)
  for simulation in (Simulation(mode="reference"), Simulation()):
    process = FedAvgSSLProcess(model, SHAPE, tff.learning.optimizers.build_adam(1e-2), CONFIG,
                               simulation=simulation, mask=mask)
    state = process.initialize()
    for r in range(3):
      state, _ = process.next(state, clients_of([r, r + 3]))
    for i, (w, w0) in enumerate(zip(state.weights, model.initial_weights)):
      if i in trained:
        assert not np.array_equal(w, w0), model.names[i]
      else:
        assert np.array_equal(w, w0), model.names[i]  # Bit-identical.
    # The upload holds only the trained tensors.
    result = process.client_update.type_signature.result
    upload = result[0] if simulation.mode == "reference" else result[0].value
    want = [tuple(model.weight_specs[i].shape) for i in mask.indices]
    if simulation.mode != "reference":  # A slot's value crosses as one flat vector of them.
      want = [(sum(int(np.prod(s)) for s in want),)]
    assert [tuple(t.shape) for t in upload] == want
    agg_value = process.run_round.type_signature.result.update.member
    assert [tuple(t.shape) for t in agg_value] == want


def test_method_state_is_checkpointed_and_restored_with_the_rest(tmp_path):
  """Through the runner's checkpoint path: a tff.program state manager saves and loads it."""
  state = server_step.ServerState(weights=[np.ones(2, np.float32)], optimizer_state=(),
                             aggregator_state=(), round_num=3,
                             method_state={"bank": np.arange(6.0).reshape(2, 3),
                                           "stage": np.int64(2)})
  manager = tff.program.FileProgramStateManager(str(tmp_path))
  asyncio.run(manager.save(state.to_program_state(), version=3))
  template = server_step.ServerState(weights=[np.zeros(2, np.float32)], optimizer_state=(),
                                aggregator_state=(), round_num=0,
                                method_state={"bank": np.zeros((2, 3)), "stage": np.int64(0)})
  loaded, version = asyncio.run(manager.load_latest(template.to_program_state()))
  back = server_step.ServerState.from_program_state(loaded)
  assert version == 3 and back.round_num == 3 and int(back.method_state["stage"]) == 2
  np.testing.assert_array_equal(back.method_state["bank"], np.arange(6.0).reshape(2, 3))


def test_many_processes_in_one_python_process_print_no_retracing_warning(caplog):
  # A table builds one process per cell in one Python process: each process's server step is its own
  # function (not a retrace of one), and TF must not warn that it keeps retracing.
  model = resnet()
  zero = [np.zeros_like(w) for w in model.initial_weights]
  with caplog.at_level("WARNING", logger="tensorflow"):
    for _ in range(7):
      loop = server_step.ServerLoop(model, tff.learning.optimizers.build_adam(learning_rate=1e-3))
      state, _ = loop.finish_round(loop.initialize(), zero, 0.0, 1)
      assert state.round_num == 1
  assert not [r for r in caplog.records if "retracing" in r.getMessage()]
