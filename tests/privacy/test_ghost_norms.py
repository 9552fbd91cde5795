"""Ghost norms (`privacy.ghost`, `dcco_private.ghost_records`, `--dp_norms=ghost`): each client's
update norm from one batched backward pass, and the clipped sum as the batch's weight gradients
with rows scaled by their clients' factors.

  * float64, on unequal clients (weight-standardized ResNet, GroupNorm, dense head): the norms, the
    clipped sum and the loss equal the per-image path's (`clipped_records`, itself checked against
    each client's own update in test_per_client_clipping.py) to 1e-10, with a clip that shortens
    some clients and not others (VICReg with augmentation multiplicity 2).
  * float32: the norms differ from the per-image path's by far less than `ghost.ROUNDING`, the
    margin the clip factor adds so that no client's share exceeds the clip.
  * A model with a weighted layer that has no ghost norm (LayerNormalization) is refused.
  * A DP-DCCO round in TFF with --dp_norms=ghost gives the per-client loop's update: in
    test_per_client_clipping.py, beside the per-image round.
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import losses
from tff_ssl.federated import common, grouping
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.methods import dcco_private, dcco_term
from tff_ssl.methods.dcco import DCCOConfig
from tff_ssl.privacy import ghost
from tests import spread
from tests.methods import test_dcco
from tests.methods.test_dcco_statistics import functional_model
from tests.privacy import test_per_client_clipping as per_client
from tests.privacy.test_per_client_clipping import AUGMENT, ETA, HP, SEED, SHAPE
from tests.privacy.test_per_client_clipping import float64  # noqa: F401  (the fixture)


def _setup(name, model, m: int = 1):
  clients = per_client._clients()
  slot = common.multiplied(grouping.pack(clients)[0], m)
  cfg = DCCOConfig(ssl=name, hparams=HP, client_learning_rate=ETA, augment=AUGMENT, seed=SEED,
                   variance_anchor=0.25)
  term = dcco_term.client_config(cfg).terms[0]
  dtype = tf.keras.backend.floatx()
  weights = [tf.constant(w, dtype) for w in model.initial_weights]
  seed = common.round_seed(SEED, 0)
  entry = losses.get_statistics(name)
  f, g = common.encode_views(model, weights, *common.views(slot, seed, AUGMENT))
  aggregate = {"statistics": entry.statistics(f, g),
               "count": tf.constant(float(f.shape[0]), dtype)}
  return term, weights, seed, slot, aggregate


def _both(model, term, weights, seed, slot, aggregate, clip):
  args = (model, term, AUGMENT, ETA, weights, seed, slot, aggregate, clip)
  return dcco_private.clipped_records(*args, chunk=per_client.CHUNK), \
      dcco_private.ghost_records(*args)


@pytest.mark.parametrize("name,m", [("cco", 1), ("vicreg", 2)])
def test_ghost_records_equal_the_per_image_records(float64, name, m):
  del float64
  model = functional_model(SHAPE)
  term, weights, seed, slot, aggregate = _setup(name, model, m)
  (_, norms, _), _ = _both(model, term, weights, seed, slot, aggregate, np.inf)
  clip = float(np.median(norms.numpy()))
  (want, want_norms, want_loss), (got, got_norms, got_loss) = _both(
      model, term, weights, seed, slot, aggregate, clip)
  assert 0 < int(np.sum(want_norms.numpy() > clip)) < len(want_norms.numpy())
  spread.within(f"float64 {name} x{m}: ghost norms vs per-image",
                spread.relative_gap(got_norms.numpy(), want_norms.numpy()), 1e-10)
  spread.within(f"float64 {name} x{m}: ghost clipped sum vs per-image",
                spread.relative_gap(got.numpy(), want.numpy()), 1e-10)
  assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-12)


def test_float32_ghost_norms_stay_well_inside_the_clip_margin():
  model = functional_model(SHAPE)
  term, weights, seed, slot, aggregate = _setup("cco", model)
  (_, want, _), (_, got, _) = _both(model, term, weights, seed, slot, aggregate, np.inf)
  gap = float(np.max(np.abs(got.numpy() / want.numpy() - 1)))
  assert gap < ghost.ROUNDING[tf.float32] / 10, gap


def test_a_layer_without_a_ghost_norm_is_refused(float64):
  del float64

  def build():
    x = tf.keras.Input(SHAPE)
    h = tf.keras.layers.Flatten()(x)
    h = tf.keras.layers.LayerNormalization()(h)  # Weights that `recording` does not see.
    return tf.keras.Model(x, tf.keras.layers.Dense(8)(h))

  model = FunctionalModel(build)
  term, weights, seed, slot, aggregate = _setup("cco", model)
  assert dcco_private.ghost_records(model, term, AUGMENT, ETA, weights, seed, slot, aggregate,
                                    1.0) is None
  records_names = ghost.uncovered([], weights, model.names)
  assert records_names == model.names


def test_dp_norms_is_checked():
  with pytest.raises(ValueError, match="--dp_norms='fast'"):
    DCCOConfig(norms="fast")


@pytest.mark.parametrize("standardize,kernel,strides,padding,size", [
    (True, 3, 1, "same", 4), (True, 3, 2, "same", 7), (False, 3, 2, "valid", 6),
    (True, 1, 2, "same", 5), (False, 2, 1, "same", 5)])
def test_conv_norms_by_gram_equal_each_clients_own_gradient(float64, standardize, kernel, strides,
                                                            padding, size):
  """A convolution's per-client filter sums (sum g^2, sum g, sum g W_hat per output filter) by both
  ways `ghost` has, the kernel gradient per offset and the pairs' Gram matrices (which the cost rule
  picks for small maps), equal those of each client's own kernel gradient, taken by autodiff one
  client at a time, to 1e-10: unequal clients with their rows scattered (1, 2 and 5 rows), stride 2,
  valid and even-kernel padding, with and without weight standardization."""
  from tff_ssl.models import layers  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  segments = np.array([2, 0, 1, 2, 2, 1, 2, 2], np.int32)  # Clients of 1, 2 and 5 rows.
  x = tf.constant(rng.normal(size=(len(segments), size, size, 3)))
  conv = (layers.WSConv2D if standardize else layers.Conv2D)(
      4, kernel, strides=strides, padding=padding, use_bias=False)
  with layers.recording() as records:
    y = conv(x)
  [record] = records
  dy = tf.constant(rng.normal(size=y.shape))
  rows = losses.statistics.ClientRows(segments, 3, 1)
  w_hat = record.standardized if standardize else conv.kernel
  want = []
  for k in range(3):
    mine = tf.constant(segments == k)
    with tf.GradientTape() as tape:
      tape.watch(w_hat)
      out = tf.nn.conv2d(tf.boolean_mask(x, mine), w_hat, strides, padding.upper())
      loss = tf.reduce_sum(out * tf.boolean_mask(dy, mine))
    g = tape.gradient(loss, w_hat)
    want.append([tf.reduce_sum(tf.square(g), [0, 1, 2]), tf.reduce_sum(g, [0, 1, 2]),
                 tf.reduce_sum(g * w_hat, [0, 1, 2])])
  want = np.array([[t.numpy() for t in client] for client in want])  # [K, 3, c_out]
  for way in (ghost._conv_filter_sums, ghost._conv_filter_sums_by_gram):  # pylint: disable=protected-access
    got = ghost._as_three(way(record, dy, rows))  # pylint: disable=protected-access
    got = np.stack([t.numpy() for t in got], 1)
    parts = slice(None) if standardize else slice(0, 1)  # Without W_hat only sum g^2 is needed.
    np.testing.assert_allclose(got[:, parts], want[:, parts], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("size,channels,pays", [(4, 64, True), (14, 16, False)])
def test_the_gram_way_is_taken_on_small_maps_of_many_filters(size, channels, pays):
  """The cost rule (multiply-adds of the two ways) on the mini model's shapes with two-row (one-image)
  clients: the Gram matrices at its 4 x 4 x 64 stage, the per-offset gradients at 14 x 14 x 16."""
  from tff_ssl.models import layers  # pylint: disable=g-import-not-at-top
  x = tf.zeros([8, size, size, channels])
  conv = layers.WSConv2D(channels, 3, padding="same", use_bias=False)
  with layers.recording() as records:
    y = conv(x)
  rows = losses.statistics.ClientRows(np.arange(8, dtype=np.int32) % 4, 4, 1)
  assert bool(ghost._gram_pays(records[0], y, rows)) == pays  # pylint: disable=protected-access
