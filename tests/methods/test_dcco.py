"""DCCO's claim (Appendix A): one round with one local GD step equals one centralized step on the union.

Also the negative control (FedAvg-CCO is not that step), the server-Adam variant, N_k weighting and the
type signatures of both processes.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import losses, models
from tff_ssl.data import AugmentConfig, two_views
from tff_ssl.federated import common, grouping
from tff_ssl.federated import masks
from tff_ssl.federated import server_step
from tff_ssl.methods import dcco, dcco_term
from tff_ssl.methods.dcco import DCCOConfig, DCCOProcess
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.grouping import Simulation
from tests import spread

SHAPE = (12, 12, 1)
AUGMENT = AugmentConfig(crop_scale=(0.5, 1.0), blur=False)
SEED = 3
ETA = 0.01


def build_keras():
  enc = models.build_encoder("resnet8", SHAPE, width=0.5)
  proj = models.build_mlp_head(enc.output_shape[-1], [32, 32, 16])
  x = tf.keras.Input(SHAPE)
  return tf.keras.Model(x, proj(enc(x)))


@pytest.fixture(scope="module")
def model():
  tf.keras.utils.set_random_seed(0)
  return FunctionalModel(build_keras)


def make_clients(sizes, seed=0):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (sum(sizes),) + SHAPE, dtype=np.uint8)
  bounds = np.cumsum([0] + list(sizes))
  clients = [common.client_inputs(images[a:b], np.arange(a, b))
             for a, b in zip(bounds[:-1], bounds[1:])]
  return images, clients


def centralized_gradient(model, weights, images):
  """The CCO gradient of one centralized step on the union, with the same views as round 0."""

  @tf.function
  def grad(w, x, ids):
    v1, v2 = two_views(x, tf.constant([SEED, 0], tf.int64), AUGMENT, ids)
    with tf.GradientTape() as tape:
      tape.watch(w)
      f, g = common.encode_views(model, w, v1, v2)
      loss = losses.cco_loss(f, g)
    return tape.gradient(loss, w)

  return [g.numpy() for g in grad([tf.constant(w) for w in weights], images,
                                  np.arange(len(images)))]


def relative_gap(a_list, b_list, reference):
  scale = max(np.abs(r).max() for r in reference)
  return max(np.abs(a - b).max() for a, b in zip(a_list, b_list)) / scale


@pytest.fixture(scope="module")
def union_and_gradient(model):
  images, clients = make_clients([1, 2, 4, 9])  # Unequal sizes, one one-image client.
  return images, clients, centralized_gradient(model, model.initial_weights, images)


def test_one_dcco_round_equals_one_centralized_step(model, union_and_gradient):
  images, clients, grad = union_and_gradient
  process = DCCOProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                        DCCOConfig(client_learning_rate=ETA, augment=AUGMENT, seed=SEED))
  state = process.initialize()
  new_state, metrics = process.next(state, clients)
  central = [w - ETA * g for w, g in zip(state.weights, grad)]
  update = [ETA * g for g in grad]
  # The paper's equivalence, through a TFF round against an in-process tf.function on the union:
  # largest gap seen 1.4e-5 of the update (four oneDNN set-ups, BUILD-notes "Numbers across CPUs").
  spread.within("DCCO round vs centralized SGD step",
                relative_gap(new_state.weights, central, update), 1e-4)
  assert new_state.round_num == 1 and metrics["clients"] == 4 and np.isfinite(metrics["loss"])


def test_one_dcco_round_with_server_adam_equals_one_centralized_adam_step(model,
                                                                           union_and_gradient):
  images, clients, grad = union_and_gradient
  adam = tff.learning.optimizers.build_adam(learning_rate=1e-3)
  process = DCCOProcess(model, SHAPE, adam,
                        DCCOConfig(client_learning_rate=1.0, augment=AUGMENT, seed=SEED))
  state = process.initialize()
  new_state, _ = process.next(state, clients)
  opt_state = adam.initialize(tuple(model.weight_specs))
  _, central = adam.next(opt_state, tuple(tf.constant(w) for w in state.weights),
                         tuple(tf.constant(g) for g in grad))
  # Adam's first step is lr * g / (|g| + eps): entries whose true gradient is zero (biases that the
  # centered statistics cancel) hold float32 round-off whose sign Adam turns into a full +-lr step.
  # Compare where the gradient stands clear of round-off; the rest are counted, and few.
  scale = max(np.abs(g).max() for g in grad)
  masks = [np.abs(g) > 1e-4 * scale for g in grad]
  assert np.mean(np.concatenate([m.ravel() for m in masks])) > 0.9
  gap = max(np.abs(a - c.numpy())[m].max(initial=0.0)
            for a, c, m in zip(new_state.weights, central, masks))
  # 1e-3 of Adam's update scale (lr = 1e-3), allowing eps effects; largest gap seen 1.5e-5
  # of it (four oneDNN set-ups).
  spread.within("DCCO round vs centralized Adam step, over the update scale", gap / 1e-3, 1e-3)


@pytest.mark.parametrize("name", ["adam", "sgdm"])
def test_elementwise_server_step_on_one_flat_vector_equals_the_per_tensor_step(model, name):
  """SGD, momentum and Adam step the trained tensors as one flat vector (`server_step.Elementwise`): the
  same weights as the per-tensor step over three rounds, partial training included (frozen tensors
  untouched); LARS (per-tensor norms) is not flattened."""
  flat_opt = server_step.server_optimizer(name, 1e-2, 3, "cosine", model.names)
  assert isinstance(flat_opt, server_step.Elementwise)
  assert not isinstance(server_step.server_optimizer("lars", 1e-2, 3, "cosine", model.names),
                        server_step.Elementwise)
  n = len(model.weight_specs)
  mask = masks.TensorMask(tuple(i % 3 != 0 for i in range(n)))  # Every third tensor frozen.
  rng = np.random.default_rng(0)
  updates = [[rng.normal(size=s.shape).astype(np.float32) for s in mask.select(model.weight_specs)]
             for _ in range(3)]
  ends = []
  for optimizer in (flat_opt, flat_opt.optimizer):
    loop = server_step.ServerLoop(model, optimizer, mask=mask)
    state = loop.initialize()
    for update in updates:
      state, _ = loop.finish_round(state, update, 0.0, 1)
    ends.append(state)
  flat_state, per_tensor_state = ends
  assert len(tf.nest.flatten(flat_state.optimizer_state)) < n  # One vector per accumulator.
  for a, b, w0, trained in zip(flat_state.weights, per_tensor_state.weights, model.initial_weights,
                               mask.trained):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert trained or np.array_equal(a, w0)
  assert any(not np.allclose(a, w0) for a, w0 in zip(flat_state.weights, model.initial_weights))


def test_fedavg_cco_round_is_not_the_centralized_step(model):
  images, clients = make_clients([2, 3, 4, 7])  # Within-client CCO needs >= 2 images.
  grad = centralized_gradient(model, model.initial_weights, images)
  process = FedAvgSSLProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                             ClientConfig(ssl="cco", client_learning_rate=ETA, augment=AUGMENT,
                                             seed=SEED))
  state = process.initialize()
  new_state, _ = process.next(state, clients)
  central = [w - ETA * g for w, g in zip(state.weights, grad)]
  assert relative_gap(new_state.weights, central, [ETA * g for g in grad]) > 1e-2


@pytest.mark.parametrize("mode", ["reference", "grouped"])
def test_phase_one_statistics_are_the_unions_statistics(model, union_and_gradient, mode):
  images, clients, _ = union_and_gradient
  simulation = Simulation(mode=mode, group_size=3)
  process = DCCOProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                        DCCOConfig(augment=AUGMENT, seed=SEED), simulation)
  data = grouping.pack(clients, 3) if simulation.grouped else clients
  aggregate = process.aggregate_statistics(common.flat_weights(model.initial_weights),
                                           common.round_seed(SEED, 0), data)

  @tf.function
  def union_stats(w, x, ids):
    v1, v2 = two_views(x, tf.constant([SEED, 0], tf.int64), AUGMENT, ids)
    return losses.encoding_statistics(*common.encode_views(model, w, v1, v2))

  want = union_stats([tf.constant(w) for w in model.initial_weights], images,
                     np.arange(len(images)))
  # TFF's phase 1 against a tf.function on the union, in units of (1e-6 + 1e-4 |want|): largest
  # seen 0.09 (mean_fg, oneDNN capped at SSE4.1; 0.068 by default).
  for name in losses.EncodingStatistics._fields:
    a = np.asarray(aggregate["statistics"][name], np.float64)
    b = getattr(want, name).numpy().astype(np.float64)
    spread.within(f"phase 1 statistics vs the union's, {name}",
                  np.max(np.abs(a - b) / (1e-6 + 1e-4 * np.abs(b))), 1.0)


@pytest.mark.parametrize("mode", ["reference", "grouped"])
def test_one_computation_round_equals_the_two_phases(model, union_and_gradient, mode):
  """On a local worker a round is one computation (`run_round`); across workers, TFF's mergeable
  execution needs the two phases apart. The same update and loss either way."""
  _, clients, _ = union_and_gradient
  simulation = Simulation(mode=mode, group_size=3)
  process = DCCOProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                        DCCOConfig(augment=AUGMENT, seed=SEED), simulation)
  data = grouping.pack(clients, 3) if simulation.grouped else clients
  weights, seed = common.flat_weights(model.initial_weights), common.round_seed(SEED, 0)
  stats = process.aggregate_statistics(weights, seed, data)
  two = process.aggregate_updates(weights, seed, stats, data)
  one = process.run_round(weights, seed, data)
  # One compiled computation against two, the statistics passing through Python between them:
  # 0 in four oneDNN set-ups (the client bodies are the same graphs).
  spread.within(f"{mode}: one-computation round vs two phases, update",
                spread.relative_gap(one["update"], two["update"]), 1e-5)
  spread.within(f"{mode}: one-computation round vs two phases, loss",
                spread.relative_gap(one["loss"], two["loss"]), 1e-5)


def test_dcco_type_signatures(model):
  process = DCCOProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0))
  stats_sig = process.aggregate_statistics.type_signature
  assert stats_sig.parameter.weights.placement == tff.SERVER
  assert stats_sig.parameter.data.placement == tff.CLIENTS
  assert stats_sig.result.placement == tff.SERVER
  d = model.output_dim
  assert stats_sig.result.member.statistics.mean_fg.shape == (d, d)
  # The weights are broadcast as one flat vector (TFF moves a struct element by element).
  assert stats_sig.parameter.weights.member == common.flat_type(model.weight_specs)
  update_sig = process.aggregate_updates.type_signature
  assert update_sig.parameter.aggregate.placement == tff.SERVER
  assert update_sig.result.update.placement == tff.SERVER
  # The update crosses the TFF boundary as one flat vector of every weight; `compute_update` gives
  # it back as the model's tensors.
  member = update_sig.result.update.member
  assert member == common.flat_type(model.weight_specs)
  assert member.shape == (sum(int(np.prod(t.shape)) for t in common.weights_type(model)),)
  # The client's half returns (update, N_k, loss): the weight is the example count.
  client_sig = process.client_update.type_signature
  assert client_sig.result[1] == tff.TensorType(np.float32)


def test_fedavg_update_is_the_nk_weighted_mean_of_client_updates(model):
  _, clients = make_clients([2, 6])
  process = FedAvgSSLProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                             ClientConfig(ssl="simclr", client_learning_rate=ETA,
                                             augment=AUGMENT, seed=SEED),
                             simulation=Simulation(mode="reference"))
  sig = process.run_round.type_signature
  assert sig.parameter.data.placement == tff.CLIENTS and sig.result.update.placement == tff.SERVER
  seed = common.round_seed(SEED, 0)
  flat = common.flat_weights(model.initial_weights)  # The broadcast crosses as one vector.
  per_client = [process.client_update(flat, seed, c) for c in clients]
  want = [(2 * a + 6 * b) / 8 for a, b in zip(per_client[0][0], per_client[1][0])]
  state = process.initialize()
  new_state, _ = process.next(state, clients)
  got = [w - n for w, n in zip(state.weights, new_state.weights)]  # Server SGD at 1: w - update.
  # The same client graph run by the process and on its own: largest gap seen 8.4e-6
  # (the same in four oneDNN set-ups; the bound was 1e-5 before, 1.2x above it).
  spread.within("FedAvg round vs the weighted mean of client updates",
                relative_gap(got, want, want), 1e-4)


def test_fedavg_rejects_one_image_clients_and_unweighted_factories(model):
  _, clients = make_clients([1, 3])
  process = FedAvgSSLProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0))
  with pytest.raises(ValueError, match="needs >= 2 images per client; got a client with 1"):
    process.next(process.initialize(), clients)
  with pytest.raises(ValueError, match="needs a tff_ssl.aggregators strategy; got SumFactory"):
    FedAvgSSLProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                     aggregation_factory=tff.aggregators.SumFactory())


def test_client_momentum_matters_only_from_the_second_local_step(model):
  _, clients = make_clients([2, 3])
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=1.0)

  def round_weights(client_optimizer, steps):
    process = DCCOProcess(model, SHAPE, sgd, DCCOConfig(
        client_optimizer=client_optimizer, client_learning_rate=ETA, local_steps=steps,
        augment=AUGMENT, seed=SEED), Simulation(mode="reference"))  # Client optimizer semantics.
    return process.next(process.initialize(), clients)[0].weights

  base = model.initial_weights

  def largest_tensor_gap(gd, m):  # Over tensors: |momentum - plain| / |plain's update|, each tensor's.
    return max(np.abs(a - b).max() / np.abs(a - w).max() for a, b, w in zip(gd, m, base))

  assert largest_tensor_gap(round_weights("sgd", 1), round_weights("sgdm", 1)) <= 1e-6
  # Two steps: the second carries 0.9 of the first's gradient (this smoke model's updates reach
  # 1e3-1e4 in the heads, so a gap is read per tensor, not against the largest update anywhere).
  assert largest_tensor_gap(round_weights("sgd", 2), round_weights("sgdm", 2)) > 1e-2
  with pytest.raises(ValueError, match="unknown client_optimizer 'adam'"):
    DCCOConfig(client_optimizer="adam")


def test_flat_vector_round_trip_and_bad_input():
  specs = [tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([4], tf.float32),
           tf.TensorSpec([], tf.float32)]
  arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.full(4, 7, np.float32),
            np.float32(-1.5)]
  flat = common.flatten([tf.constant(a) for a in arrays]).numpy()
  assert common.flat_type(specs) == tff.TensorType(np.float32, [11])
  np.testing.assert_array_equal(flat, [0, 1, 2, 3, 4, 5, 7, 7, 7, 7, -1.5])
  for got, want in zip(common.unflatten(flat, specs), arrays):
    np.testing.assert_array_equal(got, want)
    assert got.shape == np.shape(want)
  np.testing.assert_array_equal(common.flat_weights(arrays), flat)  # NumPy, as broadcast.
  for got, want in zip(common.unflatten_tensors(tf.constant(flat), specs), arrays):  # In TF.
    np.testing.assert_array_equal(got.numpy(), want)
    assert got.shape == np.shape(want)
  with pytest.raises(ValueError, match="expected a flat vector of 11 entries; got shape \\(10,\\)"):
    common.unflatten(flat[:10], specs)
  with pytest.raises(ValueError, match="one dtype"):
    common.flat_type(specs + [tf.TensorSpec([1], tf.int64)])


def test_dcco_clients_are_the_shared_client_work_with_the_statistics_term():
  from tff_ssl.federated import client_work
  client = dcco_term.client_config(dcco.DCCOConfig(ssl="vicreg", local_steps=2))
  assert isinstance(client, client_work.ClientConfig)
  assert client.ssl == "" and not client.step_views and client.local_steps == 2
  assert [type(t) for t in client.terms] == [dcco_term.StatisticsTerm]
  with pytest.raises(ValueError, match="at least one term"):
    client_work.ClientConfig(ssl="")
  with pytest.raises(ValueError, match="local_batch_size must be 0"):
    client_work.ClientConfig(ssl="cco", step_views=False, local_batch_size=4)
