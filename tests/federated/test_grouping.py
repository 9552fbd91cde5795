"""Grouped simulation equals reference simulation (one real client per TFF slot) to float round-off.

Two rounds, unequal client sizes, for DCCO and FedAvg with one and with several local steps, with one
slot per round and with several; plus the per-client weighting hook and the packing of groups.

Conditioning. A float32 comparison only means something where float32 itself is accurate, so the test
problem is chosen to be well conditioned: textured images that differ from each other, a model wide
enough that its projections vary across images, more images per round than projection dimensions (32),
and learning rates that keep each round a small step (CCO gradients are ~100x NT-Xent's). Outside that
regime the reference mode alone is not reproducible to 1e-4: with 8-16-channel convolutions, 2-image
clients or smooth images, merely reversing the order of the clients in reference mode moved round 2 by
1e-4 to 1e-3 of its update (DCCO's raw-moment variance <F^2> - <F>^2 cancels), and a within-client
CCO over fewer images than dimensions is 8e-4 away from its float64 value in either mode.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import aggregators, models
from tff_ssl import ssl as ssl_lib
from tff_ssl.data import AugmentConfig
from tff_ssl.federated import client_work, common, grouping
from tff_ssl.methods.dcco import DCCOConfig, DCCOProcess
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.grouping import Simulation
from tests import spread

SHAPE = (12, 12, 1)
AUGMENT = AugmentConfig(crop_scale=(0.5, 1.0), blur=False)
SEED = 5
REFERENCE = Simulation(mode="reference")
# Client learning rates that keep a round a small step (see the module docstring); CCO gradients are
# ~100x NT-Xent's.
LR = {"cco": 1e-4, "nt_xent": 0.05, "simclr": 0.05, "byol": 0.05,
      "simsiam": 0.05, "moco": 0.05, "mocov3": 0.05, "vicreg": 1e-3, "spectral": 1e-3}


def build_keras():
  """A small encoder of the real building blocks (WS convolutions + GroupNorm) and an MLP projector:
  small so the many traced computations here stay quick, wide enough that its projections vary
  across images (max <F>^2 / Var F = 64 at initialization; 4,800 with 8-16 channels, where the
  one-pass variance alone loses 3e-4 to float32 cancellation)."""
  x = tf.keras.Input(SHAPE)
  return tf.keras.Model(x, models.build_mlp_head(64, [64, 32])(small_encoder(x)))


def small_encoder(x):
  """build_keras' encoder on the Keras input `x`: pooled features [B, 64]."""
  h = x
  for i, channels in enumerate((32, 32, 64)):
    h = models.layers.WSConv2D(channels, 3, strides=2, padding="same", use_bias=False,
                               name=f"conv{i}")(h)
    h = models.layers.group_norm(channels, name=f"gn{i}")(h)
    h = tf.keras.layers.ReLU()(h)
  return tf.keras.layers.GlobalAveragePooling2D()(h)


def build_keras_with_predictor():
  """The same encoder and projector, plus a predictor head (BYOL, SimSiam): outputs (z, p)."""
  base = build_keras()
  p = models.build_mlp_head(32, [64, 32], name="predictor")(base.output)
  return tf.keras.Model(base.input, [base.output, p])


@functools.lru_cache(maxsize=None)
def plain_model():
  tf.keras.utils.set_random_seed(1)
  return FunctionalModel(build_keras)


@functools.lru_cache(maxsize=None)
def unit_model():
  """build_keras with each projection scaled to unit norm (--projector_output=unit)."""
  def build():
    x = tf.keras.Input(SHAPE)
    return tf.keras.Model(x, models.build_mlp_head(64, [64, 32], unit_output=True)(small_encoder(x)))
  tf.keras.utils.set_random_seed(1)
  return FunctionalModel(build)


@functools.lru_cache(maxsize=None)
def predictor_model():
  tf.keras.utils.set_random_seed(1)
  return FunctionalModel(build_keras_with_predictor)


@pytest.fixture(scope="module")
def model():
  return plain_model()


def structured_images(rng, n):
  """Images that differ from each other as real ones do (each its own pattern, texture and contrast).
  White noise gives nearly identical pooled features, and flat regions give the zero-mean
  weight-standardized kernels nothing to see; both make the losses ill-conditioned in float32."""
  coarse = tf.image.resize(rng.uniform(0, 1, (n, 4, 4, 1)), SHAPE[:2], method="bicubic").numpy()
  texture = rng.uniform(-1, 1, (n,) + SHAPE) * rng.uniform(0.05, 0.3, (n, 1, 1, 1))
  contrast = rng.uniform(0.3, 1.0, (n, 1, 1, 1))
  return np.clip(255 * (0.5 + contrast * (coarse - 0.5) + texture), 0, 255).astype(np.uint8)


def rounds_of_clients(sizes_per_round, seed=0):
  rng = np.random.default_rng(seed)
  out, next_id = [], 0
  for sizes in sizes_per_round:
    clients = []
    for n in sizes:
      images = structured_images(rng, n)
      clients.append(common.client_inputs(images, np.arange(next_id, next_id + n)))
      next_id += n
    out.append(clients)
  return out


def run_two_rounds(process, rounds, states=None, record=None):
  """Each round's aggregated update and loss, every round starting from the process's own state
  (or from `states[r]`, to compare two processes round by round from the same state); the states
  each round started from are appended to `record`."""
  state = process.initialize()
  updates, losses = [], []
  for r, clients in enumerate(rounds):
    state = states[r] if states is not None else state
    if record is not None:
      record.append(state)
    out = process.compute_update(state, clients)
    updates.append([np.asarray(u) for u in out["update"]])
    losses.append(out["loss"])
    state, _ = process.finish_round(state, out["update"], out["loss"], len(clients),
                                    out.get("aggregator_state", ()))
  return updates, losses


def assert_same_rounds(got, want, what="grouped vs reference"):
  """Per round: max |Δ| between the aggregated updates <= 1e-4 · max |update|; losses to 1e-4
  relative. Largest gaps seen over this file's and
  test_across_workers' comparisons in the four oneDNN set-ups of BUILD-notes ("Numbers across CPUs"):
  updates 2.9e-5 (DCCO and CCO with one-image clients; the set-up changes the third digit), losses
  2.3e-6."""
  (got_u, got_l), (want_u, want_l) = got, want
  for r, (g, w) in enumerate(zip(got_u, want_u)):
    assert max(np.abs(x).max() for x in w) > 0
    spread.within(f"{what}: update of round {r}", spread.relative_gap(g, w), 1e-4)
  for r, (g, w) in enumerate(zip(got_l, want_l)):
    spread.within(f"{what}: loss of round {r}", spread.relative_gap(g, w), 1e-4)


SGD = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
DCCO_ROUNDS = [[1, 5, 12, 30, 1, 9], [20, 1, 40]]  # One-image clients among larger ones.
FEDAVG_ROUNDS = [[40, 52, 36, 61], [45, 38, 70]]


@pytest.mark.parametrize("steps,simulation", [
    (1, Simulation()),  # One batched pass.
    (1, Simulation(batch_one_step=False)),  # The per-client loop, on the same round.
    (3, Simulation(group_size=2)),  # Several local steps, several slots.
])
def test_dcco_grouped_equals_reference(model, steps, simulation):
  """Round 2 starts from the reference's state in both modes (as in the FedAvg tests below): with
  three local steps, round 2 started from each mode's own round-1 weights (1-2e-5 of an update
  apart) differed by 2.5e-5, 7e-4 and 6.8e-3 of its size under three GroupNorm implementations
  equal to float round-off (Keras' masked moments, `tf.nn.moments`, sums times a reciprocal count):
  that measures the round's conditioning, not the simulation."""
  config = DCCOConfig(client_learning_rate=LR["cco"], local_steps=steps, augment=AUGMENT,
                      seed=SEED)
  rounds = rounds_of_clients(DCCO_ROUNDS)
  states = []
  want = run_two_rounds(DCCOProcess(model, SHAPE, SGD, config, REFERENCE), rounds, record=states)
  got = run_two_rounds(DCCOProcess(model, SHAPE, SGD, config, simulation), rounds, states=states)
  assert_same_rounds(got, want)


def test_dcco_grouped_equals_reference_with_unit_projections():
  """--projector_output=unit is a per-image map: the batched pass of one-image and larger clients
  still equals one client a slot."""
  config = DCCOConfig(client_learning_rate=LR["cco"], local_steps=1, augment=AUGMENT, seed=SEED)
  rounds = rounds_of_clients(DCCO_ROUNDS)
  states = []
  want = run_two_rounds(DCCOProcess(unit_model(), SHAPE, SGD, config, REFERENCE), rounds,
                        record=states)
  got = run_two_rounds(DCCOProcess(unit_model(), SHAPE, SGD, config, Simulation()), rounds,
                       states=states)
  assert_same_rounds(got, want)


@pytest.mark.parametrize("ssl,steps,simulation", [
    ("cco", 1, Simulation()),  # Batched pass, per-client CCO on the batched projections.
    ("simclr", 1, Simulation(group_size=3)),
    ("cco", 3, Simulation()),  # Several local steps: the per-client loop.
    ("simclr", 2, Simulation(group_size=2)),
    ("byol", 1, Simulation()),  # Predictor head; at one step the target is the online network.
    ("byol", 2, Simulation(group_size=2)),  # The EMA target moves within local training.
    ("simsiam", 1, Simulation(group_size=3)),
    ("moco", 1, Simulation()),  # Batched pass: every client against its zero queue.
    ("moco", 3, Simulation(group_size=2)),  # The queue fills with earlier steps' keys.
    ("mocov3", 1, Simulation()),  # Batched pass: each client's in-batch negatives only.
    # Statistics losses within each client: its own rows' statistics in the batched pass.
    ("vicreg", 1, Simulation()),
    ("spectral", 1, Simulation(group_size=3)),
])
def test_fedavg_grouped_equals_reference(ssl, steps, simulation):
  """Round 2 starts from the reference's state in both modes (as in the strategies' test below):
  MoCo v3's round-2 update, started from the two modes' round-1 weights (2e-5 of an update apart),
  differs by 1.3e-3 of its size (predictions at initialization nearly collinear: a softmax over
  nearly equal logits), which measures conditioning, not the simulation."""
  model = predictor_model() if ssl_lib.get(ssl).predictor else plain_model()
  config = ClientConfig(ssl=ssl, client_learning_rate=LR[ssl], local_steps=steps,
                           augment=AUGMENT, seed=SEED)
  rounds = rounds_of_clients(FEDAVG_ROUNDS)
  states = []
  want = run_two_rounds(FedAvgSSLProcess(model, SHAPE, SGD, config, simulation=REFERENCE), rounds,
                        record=states)
  got = run_two_rounds(FedAvgSSLProcess(model, SHAPE, SGD, config, simulation=simulation), rounds,
                       states=states)
  assert_same_rounds(got, want)


@pytest.mark.parametrize("name", sorted(aggregators.AGGREGATORS))
def test_every_strategy_is_the_same_in_both_modes(model, name):
  """Each strategy's TFF aggregation process (reference: its per-client stage at CLIENTS) equals its
  per-client stage run inside grouped slots, on unequal clients with unequal losses.

  Round 2 starts from the reference's state in both modes: with softmax(-L_k) weights, the
  reference's own round-2 update moves by 1e-3 of its size when its starting weights move by one
  float32 ulp (1.2e-7), so a difference carried over from round 1 would measure conditioning, not
  the aggregation.
  """
  config = ClientConfig(ssl="simclr", client_learning_rate=LR["simclr"], augment=AUGMENT,
                           seed=SEED)
  factory = aggregators.AggregatorConfig(name=name).build(model)
  rounds = rounds_of_clients(FEDAVG_ROUNDS)
  states = []
  want = run_two_rounds(FedAvgSSLProcess(model, SHAPE, SGD, config, factory, REFERENCE), rounds,
                        record=states)
  got = run_two_rounds(FedAvgSSLProcess(model, SHAPE, SGD, config, factory,
                                        Simulation(group_size=2)), rounds, states=states)
  assert_same_rounds(got, want)
  if name != "fedavg":  # Negative control: the strategy changes the result (it is really used).
    plain = run_two_rounds(FedAvgSSLProcess(model, SHAPE, SGD, config, simulation=REFERENCE),
                           rounds)
    gap = max(np.abs(a - b).max() for a, b in zip(plain[0][0], want[0][0]))
    assert gap > 1e-3 * max(np.abs(x).max() for x in want[0][0])


def test_grouped_upload_is_flat_unless_an_inner_factory_is_given(model):
  """A slot's contribution crosses TFF as one flat vector when the strategy's server stage is its
  own (elementwise) weighted mean; a given inner factory sees the per-tensor value, as in reference
  mode, and the rounds are the same either way."""
  config = ClientConfig(ssl="simclr", client_learning_rate=LR["simclr"], augment=AUGMENT,
                           seed=SEED)
  inner = tff.aggregators.MeanFactory(value_sum_factory=tff.aggregators.SumFactory())
  flat = FedAvgSSLProcess(model, SHAPE, SGD, config, aggregators.FedAvgFactory(),
                          Simulation(group_size=2))
  per_tensor = FedAvgSSLProcess(model, SHAPE, SGD, config, aggregators.FedAvgFactory(inner=inner),
                                Simulation(group_size=2))
  total = sum(int(np.prod(s.shape)) for s in model.weight_specs)
  assert [t.shape for t in flat.run_round.type_signature.result.update.member] == [(total,)]
  assert ([tuple(t.shape) for t in per_tensor.run_round.type_signature.result.update.member] ==
          [tuple(s.shape) for s in model.weight_specs])
  rounds = rounds_of_clients(FEDAVG_ROUNDS)
  assert_same_rounds(run_two_rounds(per_tensor, rounds), run_two_rounds(flat, rounds),
                     "per-tensor vs flat upload")


def test_minibatch_rounds_report_the_clients_first_step_loss(model):
  """Local epochs in minibatches (a tf.while_loop in TFF's graph): the round's loss is the N_k-weighted
  mean of each client's first-step loss, as the same client training computed eagerly gives it, and
  the grouped mode agrees."""
  config = ClientConfig(ssl="simclr", client_learning_rate=LR["simclr"], local_steps=2,
                           local_batch_size=16, augment=AUGMENT, seed=SEED)
  clients = rounds_of_clients(FEDAVG_ROUNDS)[0]
  process = FedAvgSSLProcess(model, SHAPE, SGD, config, simulation=REFERENCE)
  state = process.initialize()
  out = process.compute_update(state, clients)
  seed = common.round_seed(SEED, 0)
  firsts = [float(client_work.local_training(
      model, process.config, [tf.constant(w) for w in state.weights], tf.constant(seed),
      {"images": tf.constant(c["images"]), "ids": tf.constant(c["ids"])})[1]) for c in clients]
  sizes = [len(c["ids"]) for c in clients]
  assert min(firsts) > 0
  # The TFF worker against in-process TensorFlow: largest relative gap seen 7.7e-8 (four
  # oneDNN set-ups).
  spread.within("first-step loss, TFF worker vs in-process local_training",
                spread.relative_gap(out["loss"], np.average(firsts, weights=sizes)), 1e-5)
  grouped = FedAvgSSLProcess(model, SHAPE, SGD, config, simulation=Simulation(group_size=2))
  assert_same_rounds(run_two_rounds(grouped, [clients]), run_two_rounds(process, [clients]))


def test_one_round_of_loss_weighting_by_hand(model):
  """softmax(-L_k) over the reference clients' own updates and losses, computed here in NumPy."""
  config = ClientConfig(ssl="simclr", client_learning_rate=LR["simclr"], local_steps=2,
                           augment=AUGMENT, seed=SEED)
  clients = rounds_of_clients([[20, 50, 30]])[0]
  process = FedAvgSSLProcess(model, SHAPE, SGD, config, aggregators.LossFactory(),
                             Simulation(group_size=2))
  reference = FedAvgSSLProcess(model, SHAPE, SGD, config, simulation=REFERENCE)
  seed = common.round_seed(SEED, 0)
  flat = common.flat_weights(model.initial_weights)
  outs = [reference.client_update(flat, seed, c) for c in clients]
  mean_losses = np.array([o[3] for o in outs], np.float64)
  assert np.ptp(mean_losses) > 0.01  # Unequal losses, so the softmax weights differ.
  w = np.exp(-(mean_losses - mean_losses.min()))
  want = [sum(wk * o[0][i] for wk, o in zip(w, outs)) / w.sum() for i in range(len(outs[0][0]))]
  state = process.initialize()
  new_state, metrics = process.next(state, clients)
  got = [a - b for a, b in zip(state.weights, new_state.weights)]
  # Grouped TFF round against the reference clients' updates weighted in NumPy: largest gaps seen
  # 1.1e-6 (update) and 1.1e-7 (max weight) in four oneDNN set-ups (the weight's relative error is
  # about the losses' absolute error).
  spread.within("loss weighting by hand: update", spread.relative_gap(got, want), 1e-5)
  spread.within("loss weighting by hand: max weight",
                spread.relative_gap(metrics["aggregation"]["max_weight"], w.max() / w.sum()), 1e-5)
  assert metrics["aggregation"]["clients"] == 3


def test_grouped_mode_refuses_a_factory_it_cannot_run_per_client(model):
  wrapped = tff.aggregators.clipping_factory(1.0, aggregators.LDAWAFactory(
      aggregators.ModelLayout.from_model(model)))
  with pytest.raises(ValueError, match="grouped simulation runs the aggregation strategy"):
    FedAvgSSLProcess(model, SHAPE, SGD, ClientConfig(ssl="simclr"), wrapped, Simulation())
  with pytest.raises(ValueError, match="must weigh clients by their ClientInfo"):
    FedAvgSSLProcess(model, SHAPE, SGD, ClientConfig(ssl="simclr"),
                     tff.aggregators.MeanFactory(), REFERENCE)


def test_pack_concatenates_clients_into_groups():
  clients = [common.client_inputs(np.full((n, 2, 2, 1), n, np.uint8), np.arange(n) + 10 * n)
             for n in (1, 3, 2)]
  one = grouping.pack(clients)
  assert len(one) == 1
  np.testing.assert_array_equal(one[0]["sizes"], [1, 3, 2])
  np.testing.assert_array_equal(one[0]["ids"], [10, 30, 31, 32, 20, 21])
  np.testing.assert_array_equal(one[0]["images"][:, 0, 0, 0], [1, 3, 3, 3, 2, 2])
  two = grouping.pack(clients, group_size=2)
  assert [list(g["sizes"]) for g in two] == [[1, 3], [2]]
  with pytest.raises(ValueError, match="at least one client"):
    grouping.pack([])


def test_simulation_rejects_bad_values():
  with pytest.raises(ValueError, match="unknown simulation .naive."):
    Simulation(mode="naive")
  with pytest.raises(ValueError, match="group_size must be >= 0"):
    Simulation(group_size=-1)


def test_grouped_type_signature_carries_sizes(model):
  process = DCCOProcess(model, SHAPE, SGD)
  data = process.aggregate_updates.type_signature.parameter.data
  assert data.placement == tff.CLIENTS
  assert data.member.sizes == tff.TensorType(np.int32, [None])
