"""DP-DCCO's per-client clipping at batch cost (issue 53): a slot's real clients' updates from
per-image gradients in vectorized passes (`dcco_private.clipped_records`), against the reference loop that
trains each client in turn (`DCCOConfig.clip_loop`).

  * float64, the functions alone: on unequal clients (one-image ones among them), in chunks that cut
    between clients and give a 9-image client a pass of its own, the clipped sum, each client's norm
    and the loss equal the clients' own `train_against` updates, clipped as tensorflow_privacy clips
    a record, to 1e-10.
  * float32, a whole DP-DCCO round in TFF (grouped slots, noise 0, a clip that shortens some clients
    and not others): the same update and clip diagnostics as the loop's.
  * gaussian_adaptive: the batched passes move both releases' clips as the loop's records do.
  * The convolutions' sliced kernel gradient (`layers.sliced_conv2d`) is TF's, batched and per
    example under `tf.vectorized_map`.
"""

import math
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import losses
from tff_ssl.data import AugmentConfig
from tff_ssl.federated import common, grouping
from tff_ssl.federated.grouping import Simulation
from tff_ssl.methods import dcco, dcco_private, dcco_term
from tff_ssl.methods.dcco import DCCOConfig, DCCOProcess
from tff_ssl.models import layers
from tff_ssl.privacy import PrivacyConfig
from tff_ssl.ssl import Hparams
from tests import spread
from tests.methods import test_dcco
from tests.methods.test_dcco_statistics import functional_model

SHAPE = (10, 10, 3)
# Flips only: float32 crop boxes differ in the last bit with the batch's size (one client's images
# against the slot's), which float64 would see (tests/methods/test_dcco_statistics.py).
AUGMENT = AugmentConfig.flip_only()
SEED, ETA = 4, 2.0 ** -6
SIZES = [1, 2, 1, 4, 1, 9, 1, 3, 1]  # 23 images over 9 clients, five of them with one image.
CHUNK = 4  # Chunks of whole clients: [1, 2, 1], [4], [1], [9] (alone), [1, 3], [1].
HP = Hparams(cco_lambda=5.0, vicreg_invariance=5.0, vicreg_variance=5.0, vicreg_covariance=1.0)


@pytest.fixture
def float64():
  before = tf.keras.backend.floatx()
  tf.keras.backend.set_floatx("float64")
  yield
  tf.keras.backend.set_floatx(before)


def _clients():
  rng = np.random.default_rng(2)
  images = rng.integers(0, 256, (sum(SIZES),) + SHAPE, dtype=np.uint8)
  ids = rng.permutation(1000)[:sum(SIZES)].astype(np.int64)  # Scattered, unordered ids.
  bounds = np.cumsum([0] + SIZES)
  return [common.client_inputs(images[a:b], ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("name", ["cco", "vicreg"])
def test_batched_records_equal_each_clients_own_clipped_update(float64, name):
  del float64
  model = functional_model(SHAPE)
  clients = _clients()
  slot = grouping.pack(clients)[0]
  cfg = DCCOConfig(ssl=name, hparams=HP, client_learning_rate=ETA, augment=AUGMENT, seed=SEED,
                   variance_anchor=0.25)
  client = dcco_term.client_config(cfg)
  weights = [tf.constant(w) for w in model.initial_weights]
  seed = common.round_seed(SEED, 0)
  entry = losses.get_statistics(name)
  f, g = common.encode_views(model, weights, *common.views(slot, seed, AUGMENT))
  aggregate = {"statistics": entry.statistics(f, g),
               "count": tf.constant(float(sum(SIZES)), tf.float64)}

  records, losses_ = [], []
  for c in clients:  # The reference: each client's own local training.
    delta, loss, _ = dcco_term.train_against(model, client, weights, seed, c, aggregate)
    records.append(len(c["ids"]) * common.flatten(delta).numpy())
    losses_.append(float(loss))
  norms = np.array([np.linalg.norm(r) for r in records])
  clip = float(np.median(norms))  # Shortens four clients, leaves five.
  want = sum(r * clip / max(n, clip) for r, n in zip(records, norms))

  total, got_norms, loss = dcco_private.clipped_records(model, client.terms[0], AUGMENT, ETA, weights,
                                                seed, slot, aggregate, clip, chunk=CHUNK)
  assert 0 < int(np.sum(norms > clip)) < len(SIZES)
  spread.within(f"float64 {name}: batched clipped sum vs the clients' own",
                spread.relative_gap(total.numpy(), want), 1e-10)
  spread.within(f"float64 {name}: batched norms vs the clients' own",
                spread.relative_gap(got_norms.numpy(), norms), 1e-10)
  assert float(loss) == pytest.approx(losses_[0], rel=1e-12)
  assert np.ptp(losses_) < 1e-9  # Every client's loss is the aggregate's.


def _dp_round(clip_loop: bool, clients, clip: float, dp: str = "gaussian_fixed",
              statistics_clip: float = 0.0, rounds: int = 1, statistics_quantile: float = 0.5,
              statistics_clip_rate: float = 0.2, history: list | None = None,
              augmentations: int = 1, norms: str = "per_image"):
  model = test_dcco.model.__wrapped__()
  privacy = PrivacyConfig(dp=dp, noise_multiplier=0.0, clip=clip, statistics_clip=statistics_clip,
                          statistics_quantile=statistics_quantile,
                          statistics_clip_rate=statistics_clip_rate, population=1000,
                          clients_per_round=len(clients), releases=2)
  config = DCCOConfig(client_learning_rate=test_dcco.ETA, augment=test_dcco.AUGMENT,
                      seed=test_dcco.SEED, privacy=privacy,
                      denominator=float(sum(len(c["ids"]) for c in clients)), clip_loop=clip_loop,
                      augmentations=augmentations, norms=norms)
  assert dcco_private.batched_clipping(config) is not clip_loop
  process = DCCOProcess(model, test_dcco.SHAPE, tff.learning.optimizers.build_sgdm(1.0), config,
                        Simulation(group_size=3))
  state = new_state = process.initialize()
  for _ in range(rounds):
    state, (new_state, metrics) = new_state, process.next(new_state, clients)
    if history is not None:
      history.append(metrics["aggregation"])
  return [a - b for a, b in zip(new_state.weights, state.weights)], metrics


@pytest.mark.parametrize("norms", ["per_image", "ghost"])  # --dp_norms: privacy/ghost.py.
def test_a_dp_dcco_round_clips_each_client_as_the_loop_does(norms):
  _, clients = test_dcco.make_clients([1, 2, 1, 4, 1, 9, 1])
  loop_update, loop_metrics = _dp_round(True, clients, clip=75.0)
  update, metrics = _dp_round(False, clients, clip=75.0, norms=norms)
  fraction = metrics["aggregation"]["update_clipped_fraction"]
  assert 0 < fraction < 1 and fraction == loop_metrics["aggregation"]["update_clipped_fraction"]
  assert metrics["aggregation"]["update_norm"] == pytest.approx(
      loop_metrics["aggregation"]["update_norm"], rel=1e-5)
  # float32 round-off of sums whose terms cancel (measured 7e-5 at this round).
  spread.within(f"DP-DCCO round, {norms} norms: batched clipping vs the per-client loop",
                spread.relative_gap(update, loop_update), 1e-3)


@pytest.mark.parametrize("stride,padding", [(1, "SAME"), (2, "SAME"), (1, "VALID"), (2, "VALID")])
def test_sliced_kernel_gradient_is_tfs(float64, stride, padding):
  del float64
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=(3, 7, 8, 2)))
  kernel = tf.constant(rng.normal(size=(3, 3, 2, 4)))
  dy_seed = rng.normal(size=(3, 8, 8, 4))

  def grads(conv, x):
    with tf.GradientTape() as tape:
      tape.watch([x, kernel])
      y = conv(x)
      loss = tf.reduce_sum(y * dy_seed[:y.shape[0], :y.shape[1], :y.shape[2]])
    return tape.gradient(loss, [x, kernel])

  def tfs(x):
    return tf.nn.conv2d(x, kernel, [1, stride, stride, 1], padding)

  def sliced(x):
    return layers.sliced_conv2d(x, kernel, (stride, stride), padding)

  for want, got in zip(grads(tfs, x), grads(sliced, x)):
    assert spread.relative_gap(got.numpy(), want.numpy()) < 1e-12
  per_example = tf.vectorized_map(lambda xi: grads(sliced, xi[None])[1], x)
  for i in range(3):
    want = grads(tfs, x[i:i + 1])[1]
    assert spread.relative_gap(per_example[i].numpy(), want.numpy()) < 1e-12


def test_adaptive_dp_dcco_moves_both_clips_as_the_loop_does():
  """gaussian_adaptive for DCCO's two releases: the batched passes' clip votes (each client's
  norm through tfp's quantile estimator) move the statistics and update clips as the per-client
  loop's records do; the second round clips at the moved clips, and its update is the loop's.
  The statistics clip aims at its own quantile and moves at its own rate
  (--dp_statistics_quantile, --dp_statistics_clip_rate), the update's at the median and TFF's
  0.2: without noise each moves by exactly TFF's geometric rule,
  C exp(-rate (unclipped fraction - target))."""
  _, clients = test_dcco.make_clients([1, 2, 1, 4, 1, 9, 1])
  got, history = {}, []
  for loop in (True, False):
    got[loop] = _dp_round(loop, clients, clip=75.0, dp="gaussian_adaptive", statistics_clip=50.0,
                          rounds=2, statistics_quantile=0.9, statistics_clip_rate=0.7,
                          history=None if loop else history)
  (loop_update, loop_metrics), (update, metrics) = got[True], got[False]
  for release, start, target, rate in (("update", 75.0, 0.5, 0.2),
                                       ("statistics", 50.0, 0.9, 0.7)):
    unclipped = 1.0 - history[0][f"{release}_clipped_fraction"]
    assert history[1][f"{release}_clip"] == pytest.approx(
        start * math.exp(-rate * (unclipped - target)), rel=1e-5)
  for release, start in (("update", 75.0), ("statistics", 50.0)):
    clip = metrics["aggregation"][f"{release}_clip"]  # The second round's: moved once.
    assert clip != start and clip == pytest.approx(loop_metrics["aggregation"][f"{release}_clip"],
                                                   rel=1e-6)
    assert metrics["aggregation"][f"{release}_clipped_fraction"] == (
        loop_metrics["aggregation"][f"{release}_clipped_fraction"])
  spread.within("adaptive DP-DCCO, round 2: batched clipping vs the per-client loop",
                spread.relative_gap(update, loop_update), 1e-3)


def test_a_fixed_statistics_clip_stays_while_the_update_clip_moves():
  """gaussian_adaptive at --dp_statistics_clip_rate=0: the statistics clip stays at
  --dp_statistics_clip round after round while the update's adapts, and the batched passes give
  the per-client loop's clips, clipped fractions and update."""
  _, clients = test_dcco.make_clients([1, 2, 1, 4, 1, 9, 1])
  got, history = {}, []
  for loop in (True, False):
    got[loop] = _dp_round(loop, clients, clip=75.0, dp="gaussian_adaptive", statistics_clip=50.0,
                          rounds=2, statistics_clip_rate=0.0,
                          history=None if loop else history)
  (loop_update, loop_metrics), (update, metrics) = got[True], got[False]
  assert [h["statistics_clip"] for h in history] == [50.0, 50.0]
  assert 0 < history[0]["statistics_clipped_fraction"] < 1  # The clip binds, and does not move.
  unclipped = 1.0 - history[0]["update_clipped_fraction"]
  assert history[1]["update_clip"] == pytest.approx(75.0 * math.exp(-0.2 * (unclipped - 0.5)),
                                                    rel=1e-5)
  for release in ("update", "statistics"):
    assert metrics["aggregation"][f"{release}_clip"] == pytest.approx(
        loop_metrics["aggregation"][f"{release}_clip"], rel=1e-6)
    assert metrics["aggregation"][f"{release}_clipped_fraction"] == (
        loop_metrics["aggregation"][f"{release}_clipped_fraction"])
  spread.within("DP-DCCO, fixed statistics clip, round 2: batched clipping vs the per-client loop",
                spread.relative_gap(update, loop_update), 1e-3)
