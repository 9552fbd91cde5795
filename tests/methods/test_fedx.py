"""FedX as a client add-on (tff_ssl/methods/fedx.py): `--fedx` gives a SimCLR model a predictor and
its clients the term; the term's loss is FedX's three terms (checked against the NumPy equations of
tests/losses/test_relational.py) of the right outputs: local predictions against the round's
global model, never against where a stateful client started. The run-level contract (bin/train on
FedSimCLR, grouped, kill and resume): tests/methods/test_contract.py."""

import numpy as np
import pytest
import tensorflow as tf

from tests.federated.test_round_anatomy import AUGMENT, SHAPE, clients_of
from tests.losses.test_relational import _nt_xent, _relational
from tff_ssl import experiment
from tff_ssl.federated import client_work, common, ssl_model
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.methods import fedavg, fedx

SMALL = dict(encoder="resnet8", width=0.25, projector=(16, 8), predictor=(16, 8))


def config(**kw):
  return experiment.ExperimentConfig(**{"method": "fedavg", "ssl": "simclr", "fedx": True,
                                        "seed": 3, **kw})


def model_of(cfg):
  tf.keras.utils.set_random_seed(5)
  return FunctionalModel(ssl_model.ssl_model_builder(cfg, SHAPE))


def test_the_flag_gives_simclr_a_predictor_and_the_clients_the_term():
  with_fedx, without = config(), config(fedx=False)
  assert with_fedx.has_predictor and not without.has_predictor
  assert [type(t) for t in fedavg.process_config(with_fedx)[0].terms] == [fedx.FedXTerm]
  assert fedavg.process_config(without)[0].terms == ()
  assert len(model_of(config(encoder="resnet8", width=0.25, projector=(16, 8))).output_dims) == 2
  with pytest.raises(ValueError, match="fedx"):  # DCCO's clients take no add-on.
    experiment.ExperimentConfig(method="dcco").check_fields_for_method({"fedx"})


def _step(model, start, current, broadcast, seed=(1, 2)):
  data = clients_of([7], n=6)[0]
  seed = tf.constant(seed, tf.int64)
  v1, v2 = common.views(data, seed, AUGMENT)
  outputs = client_work.view_outputs(model, client_work.TERMS_ONLY, current, None, v1, v2,
                                     predictions=True)
  return client_work.Step(model, outputs, start, current, v1, v2, data, seed, AUGMENT, broadcast)


def test_the_terms_loss_is_fedxs_three_terms_of_the_local_and_global_outputs():
  cfg = config(**SMALL)
  model = model_of(cfg)
  glob = [tf.constant(w) for w in model.initial_weights]
  rng = np.random.default_rng(0)
  current = [w + tf.constant(0.05 * rng.normal(size=w.shape), w.dtype) for w in glob]
  step = _step(model, glob, current, None)
  loss, _ = fedx.FedXTerm(0.2).loss(step, None)
  # The same images by hand: the anchors, then each model's outputs, then the NumPy equations.
  anchors = fedx.anchor_batch(step.data, step.seed, 6, AUGMENT)
  z1, q1 = [o.numpy() for o in model(current, step.v1)]
  z2, q2 = [o.numpy() for o in model(current, step.v2)]
  za = model(current, anchors)[0].numpy()
  g2, ga = model(glob, step.v2)[0].numpy(), model(glob, anchors)[0].numpy()
  want = _nt_xent(q1, g2, 0.2) + _relational(z1, z2, za, 0.2, 0.2) + _relational(q1, q2, ga, 0.2, 0.2)
  np.testing.assert_allclose(float(loss), want, rtol=2e-5)
  # The anchors: 6 distinct images of the client's 6, in an order the seed sets.
  other = fedx.anchor_batch(step.data, tf.constant([1, 3], tf.int64), 6, AUGMENT)
  assert not np.allclose(anchors.numpy(), other.numpy())
  assert fedx.anchor_batch(step.data, step.seed, 9, AUGMENT).shape[0] == 6


def test_the_global_terms_read_the_broadcast_model_not_the_clients_start():
  model = model_of(config(**SMALL))
  glob = [tf.constant(w) for w in model.initial_weights]
  rng = np.random.default_rng(1)  # (Not a rescaling: standardized layers are scale-invariant.)
  own = [w + tf.constant(0.1 * rng.normal(size=w.shape), w.dtype) for w in glob]  # A FedEMA start.
  current = [w + tf.constant(0.01 * rng.normal(size=w.shape), w.dtype) for w in own]
  term = fedx.FedXTerm()
  given = float(term.loss(_step(model, own, current, glob), None)[0])
  assert given == float(term.loss(_step(model, glob, current, None), None)[0])
  assert abs(given - float(term.loss(_step(model, own, current, None), None)[0])) > 1e-2


def test_predictor_sizes_are_read_where_the_model_has_a_predictor():
  config(fedx=True).check_fields_for_method({"predictor"})  # FedX's head on SimCLR.
  with pytest.raises(ValueError, match="--predictor is not used by method 'fedavg' with "
                                       "--ssl=simclr"):
    config(fedx=False).check_fields_for_method({"predictor"})
