"""DCCO of every statistics loss, in float64: one round with one local gradient step equals one
centralized step on the union (Appendix A, here for CCO, VICReg and the spectral contrastive loss), on
clients of unequal sizes with several one-image clients; the check fails on a perturbed statistic.

Float64 because in float32 the check is ill-conditioned at random initialization: near-zero feature
variances, divided by sqrt(var + eps), amplify round-off until it cannot be told from a bug (issue 36:
1e-5 or 2e-2 of the largest gradient entry, depending on the image set). In float64 the paths agree
to ~1e-13, in both execution contexts: TFF's static Grappler pass on (as bin/train runs) and off (as
the rest of the suite runs). With it on, images used to reach the model 1 float32 ulp off (a folded
division by 255; `tff_ssl.data.augment.to_float`) and the round missed the step by ~1e-6.

Also `--dcco_statistics=previous`: a round trains against the previous round's aggregate and releases
its own; its first round is the two-phase round.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import losses, models, runtime
from tff_ssl.data import AugmentConfig, two_views
from tff_ssl.federated import common, grouping
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.grouping import Simulation
from tff_ssl.methods.dcco import DCCOConfig, DCCOProcess
from tff_ssl.ssl import Hparams
from tests import spread

SHAPE = (10, 10, 3)
# Flips only: a crop's box comes from float32 exp / sqrt, whose last bit depends on the batch's size
# (vectorized packets against a scalar tail), so cropped views of one client and of the union differ
# by ~1e-6; flipped views are the same bits, and the comparison is of DCCO's arithmetic alone.
AUGMENT = AugmentConfig.flip_only()
# TFF's optimizers hold their learning rate in float32: a power of two is the same number in float64.
SEED, ETA = 5, 2.0 ** -7
SIZES = [1, 4, 1, 2, 1, 5, 7]  # 21 RGB images over 7 clients, three of them with one image.
HP = Hparams(cco_lambda=5.0, vicreg_invariance=5.0, vicreg_variance=5.0, vicreg_covariance=1.0)
# The statistics each loss is linear in: VICReg's invariance, the spectral loss's positive term and its
# diagonal correction.
LINEAR = {"cco": (), "vicreg": ("mean_distance",), "spectral": ("mean_dot", "mean_dot_sq")}
TOLERANCE = 1e-10  # Of the update's largest entry; float64 paths agree to ~1e-13.


@pytest.fixture(params=["grappler_on", "grappler_off"])
def context(request):
  """The execution context bin/train runs in (TFF's static Grappler pass on), and the suite's."""
  runtime.configure_context(static_graph_optimization=request.param == "grappler_on")
  yield request.param
  runtime.configure_context(static_graph_optimization=False)  # tests/conftest.py's.


@pytest.fixture(scope="module")
def float64():
  before = tf.keras.backend.floatx()
  tf.keras.backend.set_floatx("float64")
  yield
  tf.keras.backend.set_floatx(before)


def functional_model(shape):
  def build():
    enc = models.build_encoder("resnet8", shape, width=0.5)
    proj = models.build_mlp_head(enc.output_shape[-1], [16, 8])
    x = tf.keras.Input(shape)
    return tf.keras.Model(x, proj(enc(x)))

  tf.keras.utils.set_random_seed(0)
  return FunctionalModel(build)


@pytest.fixture(scope="module")
def model(float64):
  del float64
  return functional_model(SHAPE)


_gray = []


@pytest.fixture(scope="module", autouse=True)
def _release_the_modules_processes():
  """The float64 processes and model live as long as this module's tests, not the worker's."""
  yield
  _processes.clear()
  _gray.clear()


def gray_model():
  """The one-channel model, built once in this module (float64, under the `float64` fixture)."""
  if not _gray:
    _gray.append(functional_model((10, 10, 1)))
  return _gray[0]


def client_data(shape, ids):
  """(the union's images, ids; each client's inputs): SIZES images, example ids `ids`."""
  rng = np.random.default_rng(1)
  images = rng.integers(0, 256, (sum(SIZES),) + shape, dtype=np.uint8)
  bounds = np.cumsum([0] + SIZES)
  return images, ids, [common.client_inputs(images[a:b], ids[a:b])
                       for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.fixture(scope="module")
def clients():
  images, _, data = client_data(SHAPE, np.arange(sum(SIZES)))
  return images, data


def centralized_gradient(model, entry, weights, images, ids=None):
  """The loss's gradient of one centralized step on the union, with round 0's views, computed eagerly:
  no graph rewrite between it and the reference. (Since `to_float` is a lookup, a `tf.function` of the
  same gradient agrees with it to 2e-14; before, Grappler's folded division by 255 put it 4e-8 off.)"""

  def grad(w, x, ids):
    v1, v2 = two_views(x, tf.constant([SEED, 0], tf.int64), AUGMENT, ids)
    with tf.GradientTape() as tape:
      tape.watch(w)
      loss = entry.batch_loss(*common.encode_views(model, w, v1, v2), HP)
    return tape.gradient(loss, w)

  return [g.numpy() for g in grad([tf.constant(w) for w in weights], images,
                                  np.arange(len(images)) if ids is None else ids)]


# Built processes, shared by the tests of this module: a test run in both execution contexts traces
# its process once (the context compiles it on its first call in each).
_processes = {}


def process_of(model, name, mode="reference", statistics="current", shape=SHAPE, group_size=3):
  key = (id(model), name, mode, statistics, shape, group_size)
  if key not in _processes:
    _processes[key] = (model, _build_process(model, name, mode, statistics, shape, group_size))
  return _processes[key][1]


def _build_process(model, name, mode, statistics, shape, group_size):
  return DCCOProcess(model, shape, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                     DCCOConfig(ssl=name, hparams=HP, client_learning_rate=ETA, augment=AUGMENT,
                                seed=SEED, statistics=statistics),
                     Simulation(mode=mode, group_size=group_size))


def centralized_update(model, name, images, ids=None) -> list:
  """One centralized step's update from the initial weights: ETA times `centralized_gradient`."""
  return [ETA * g for g in centralized_gradient(model, losses.STATISTICS[name],
                                                model.initial_weights, images, ids)]


def round_gap(process, update, data) -> float:
  """How far one round's update is from `update` (of its largest entry)."""
  state = process.initialize()
  new_state, metrics = process.next(state, data)
  assert np.isfinite(metrics["loss"]) and new_state.weights[0].dtype == np.float64
  return spread.relative_gap([w0 - w for w0, w in zip(state.weights, new_state.weights)], update)


def test_the_model_and_the_round_run_in_float64(model):
  assert all(s.dtype == tf.float64 for s in model.weight_specs)
  process = process_of(model, "cco")
  assert process.aggregate_statistics.type_signature.result.member.statistics.mean_fg.dtype == (
      tff.TensorType(np.float64, [8, 8]).dtype)


# Every registered statistics loss (a new one must say which of its terms are linear: LINEAR), and one
# in the grouped simulation.
@pytest.mark.parametrize("name,mode", [(n, "reference") for n in sorted(losses.STATISTICS)] +
                         [("vicreg", "grouped")])
def test_one_round_equals_one_centralized_step_and_fails_on_a_perturbed_statistic(
    model, clients, name, mode, context):
  images, data = clients
  entry = losses.STATISTICS[name]
  update = centralized_update(model, name, images)
  process = process_of(model, name, mode)
  gap = round_gap(process, update, data)
  spread.within(f"float64 {name} ({mode}, {context}): round vs centralized step", gap, TOLERANCE)

  # The same phase 2 against a statistic off by 1e-6 of itself misses the step, for every term the
  # loss is nonlinear in; a term it is linear in (a mean of per-image losses) enters the gradient
  # through the client's own share only, so its aggregate value cannot move the update. (A property
  # of the loss, not of the context: checked in one.)
  if context == "grappler_on":
    return
  packed = grouping.pack(data, 3) if mode == "grouped" else data
  state = process.initialize()
  weights, seed = common.flat_weights(state.weights), common.round_seed(SEED, 0)
  aggregate = process.aggregate_statistics(weights, seed, packed)
  exact = process.aggregate_updates(weights, seed, aggregate, packed)["update"]
  flat_update = common.flatten([tf.constant(u) for u in update]).numpy()
  assert spread.relative_gap(exact, flat_update) < TOLERANCE
  for key in entry.names:
    stats = collections.OrderedDict(aggregate["statistics"])
    stats[key] = np.asarray(stats[key]) * (1 + 1e-6) + 1e-9
    nudged = collections.OrderedDict(statistics=stats, count=aggregate["count"])
    off = process.aggregate_updates(weights, seed, nudged, packed)["update"]
    if key in LINEAR[name]:
      assert spread.relative_gap(off, flat_update) < TOLERANCE, (name, key)
    else:
      assert spread.relative_gap(off, flat_update) > 100 * TOLERANCE, (name, key)


@pytest.mark.parametrize("name", sorted(losses.STATISTICS))
def test_grayscale_clients_with_scattered_ids_in_slots_of_two_sizes(float64, name, context):
  """One-channel images, example ids that are neither contiguous nor ordered (they seed each image's
  views), and the grouped simulation packing 7 clients by 3: slots of 3, 3 and 1 clients, of 6, 8 and
  7 images."""
  del float64
  shape = (10, 10, 1)
  model = gray_model()
  ids = np.random.default_rng(2).permutation(1000)[:sum(SIZES)] * 7 + 3
  images, ids, data = client_data(shape, ids)
  process = process_of(model, name, "grouped", shape=shape)
  gap = round_gap(process, centralized_update(model, name, images, ids), data)
  spread.within(f"float64 {name} (grayscale, grouped, {context}): round vs centralized step", gap,
                TOLERANCE)


def test_previous_statistics_run_one_phase_after_a_two_phase_first_round(model, clients):
  """Round 0 runs both phases (no statistics yet) and is the centralized step; round 1 trains against
  round 0's aggregate (one phase) and releases its own, which are the statistics of its weights."""
  images, data = clients
  entry = losses.STATISTICS["cco"]
  stale, exact = process_of(model, "cco", statistics="previous"), process_of(model, "cco")
  state = stale.initialize()
  assert float(state.method_state["count"]) == 0 and not stale.has_previous(state)
  s1, _ = stale.next(state, data)
  e1, _ = exact.next(exact.initialize(), data)
  assert spread.relative_gap(s1.weights, e1.weights) < 1e-14  # Round 0: the same two-phase round.
  assert float(s1.method_state["count"]) == sum(SIZES)
  weights, seed = common.flat_weights(state.weights), common.round_seed(SEED, 0)
  round0 = exact.aggregate_statistics(weights, seed, data)
  for key in entry.names:  # What round 0 released: the statistics at the weights it broadcast.
    assert spread.relative_gap(s1.method_state["statistics"][key],
                               round0["statistics"][key]) < 1e-12

  s2, metrics = stale.next(s1, data)  # One phase against round 0's statistics.
  e2, _ = exact.next(e1, data)
  weights1, seed1 = common.flat_weights(s1.weights), common.round_seed(SEED, 1)
  want = exact.aggregate_updates(weights1, seed1, s1.method_state, data)["update"]
  got = common.flat_weights(s1.weights) - common.flat_weights(s2.weights)
  assert spread.relative_gap(got, want) < 1e-12
  assert spread.relative_gap(s2.weights, e2.weights) > 1e-8  # Stale statistics: another step.
  round1 = exact.aggregate_statistics(weights1, seed1, data)
  for key in entry.names:
    assert spread.relative_gap(s2.method_state["statistics"][key],
                               round1["statistics"][key]) < 1e-12
  assert np.isfinite(metrics["loss"])


def _anchors(f, g, mean_weight, variance_weight):
  """The two anchors computed directly from the union's encodings (an independent reference)."""
  value = 0.0
  for x in (f, g):
    mean, var = tf.reduce_mean(x, 0), tf.math.reduce_variance(x, 0)
    value += (mean_weight * tf.reduce_mean(mean ** 2) +
              variance_weight * tf.reduce_mean((var - 1.0) ** 2))
  return value


@pytest.mark.parametrize("name", ["cco", "vicreg"])
@pytest.mark.parametrize("mean_weight,variance_weight", [(0.5, 0.0), (0.5, 0.3)])
def test_an_anchored_round_equals_the_centralized_step_of_the_anchored_loss(
    model, clients, name, mean_weight, variance_weight):
  """--dcco_mean_anchor adds weight x (mean_d <f>_d^2 + mean_d <g>_d^2) of the union's means, and
  --dcco_variance_anchor weight x (mean_d (var f_d - 1)^2 + mean_d (var g_d - 1)^2) of its variances:
  terms of the statistics like the loss's own, so the round is still the centralized step, of the
  sum."""
  images, data = clients
  entry = losses.STATISTICS[name]

  def grad(w, x, ids):
    v1, v2 = two_views(x, tf.constant([SEED, 0], tf.int64), AUGMENT, ids)
    with tf.GradientTape() as tape:
      tape.watch(w)
      f, g = common.encode_views(model, w, v1, v2)
      loss = entry.batch_loss(f, g, HP) + _anchors(f, g, mean_weight, variance_weight)
    return tape.gradient(loss, w)

  update = [ETA * g.numpy() for g in grad([tf.constant(w) for w in model.initial_weights], images,
                                          np.arange(len(images)))]
  process = DCCOProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                        DCCOConfig(ssl=name, hparams=HP, client_learning_rate=ETA, augment=AUGMENT,
                                   seed=SEED, mean_anchor=mean_weight,
                                   variance_anchor=variance_weight), Simulation(mode="reference"))
  gap = round_gap(process, update, data)
  spread.within(f"float64 {name} + anchors {mean_weight}, {variance_weight}: round vs centralized "
                f"step", gap, TOLERANCE)
  assert spread.relative_gap(update, centralized_update(model, name, images)) > 1e-6  # It moved.


def test_the_anchors_need_mean_and_variance_statistics():
  with pytest.raises(ValueError, match=r"--ssl=spectral has none of \(its statistics: mean_dot"):
    DCCOConfig(ssl="spectral", mean_anchor=0.1)
  with pytest.raises(ValueError, match=r"--dcco_variance_anchor=0.1 .* --ssl=spectral's statistics "
                                       r"\(mean_dot.*set --dcco_variance_anchor=0"):
    DCCOConfig(ssl="spectral", variance_anchor=0.1)
  with pytest.raises(ValueError, match="dcco_mean_anchor"):
    DCCOConfig(ssl="cco", mean_anchor=-1.0)
  with pytest.raises(ValueError, match="dcco_variance_anchor"):
    DCCOConfig(ssl="cco", variance_anchor=-1.0)


def test_a_refresh_round_runs_both_phases_against_its_own_statistics(model, clients):
  """--dcco_refresh_every=2: rounds 0 and 2 are two-phase rounds (fresh statistics), round 1 and 3
  one phase against the round before's."""
  images, data = clients
  del images
  stale = DCCOProcess(model, SHAPE, tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                      DCCOConfig(ssl="cco", hparams=HP, client_learning_rate=ETA, augment=AUGMENT,
                                 seed=SEED, statistics="previous", refresh_every=2),
                      Simulation(mode="reference"))
  exact = process_of(model, "cco")
  state, phases = stale.initialize(), []
  for _ in range(3):
    phases.append(1 if stale.has_previous(state) else 2)
    before = state
    state, _ = stale.next(state, data)
  assert phases == [2, 1, 2] and stale.has_previous(state)
  weights, seed = common.flat_weights(before.weights), common.round_seed(SEED, 2)
  fresh = exact.aggregate_statistics(weights, seed, data)
  want = exact.aggregate_updates(weights, seed, fresh, data)["update"]
  got = common.flat_weights(before.weights) - common.flat_weights(state.weights)
  assert spread.relative_gap(got, want) < 1e-12
  with pytest.raises(ValueError, match="set --dcco_statistics=previous or --dcco_refresh_every=0"):
    DCCOConfig(ssl="cco", refresh_every=2)
