"""An SSL method in one module: its per-client form optional (a loop over clients by default) and its
hyperparameters declared with it, assembled into `ssl.HPARAMS` by the registry."""

import dataclasses
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from tff_ssl import ssl as ssl_lib
from tff_ssl.config_fields import Field

SIZES = [3, 1, 4]  # A one-image client between two others.
HP = ssl_lib.Hparams(temperature=0.3, cco_lambda=2.0)


def outputs(seed=0, queue=False):
  rng = np.random.default_rng(seed)
  rows = {n: tf.constant(rng.normal(size=(sum(SIZES), 5))) for n in ("z1", "z2", "p1", "p2", "t1", "t2")}
  return ssl_lib.Outputs(**rows, queue=tf.constant(rng.normal(size=(6, 5))) if queue else None)


@pytest.mark.parametrize("name", sorted(ssl_lib.SSL_METHODS))
def test_without_a_per_client_form_the_loop_gives_the_same_losses_and_gradients(name):
  method = ssl_lib.get(name)
  looped = dataclasses.replace(method, per_client_loss=None)
  out = outputs(queue=method.queue)
  # Losses of 2 or more images a client (simclr, mocov3, the statistics losses) leave out the
  # one-image client. CCO's loop (its correlation matrix) is checked against its Gram form.
  sizes = SIZES if method.min_samples == 1 else [3, 4]
  out = out._replace(**{n: getattr(out, n)[:sum(sizes)] for n in ("z1", "z2", "p1", "p2", "t1", "t2")})

  @tf.function  # In a graph, as inside a TFF computation.
  def losses_and_gradient(m, z1, p1):
    with tf.GradientTape() as tape:
      tape.watch([z1, p1])
      k = m.losses_per_client(out._replace(z1=z1, p1=p1), tf.constant(sizes), HP)
      total = tf.reduce_sum(k * tf.range(1.0, len(sizes) + 1.0, dtype=k.dtype))
    return k, tape.gradient(total, [z1, p1], unconnected_gradients="zero")

  want, want_grad = losses_and_gradient(method, out.z1, out.p1)
  got, got_grad = losses_and_gradient(looped, out.z1, out.p1)
  assert got.shape == (len(sizes),)
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10)
  for g, w in zip(got_grad, want_grad):
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-9, atol=1e-12)
  assert np.abs(want_grad[0].numpy()).sum() + np.abs(want_grad[1].numpy()).sum() > 0


def test_hyperparameters_are_the_methods_fields_each_declared_once():
  declared = {}
  for m in ssl_lib.SSL_METHODS.values():
    for f in m.fields:
      declared.setdefault(f.name, set()).add(f)
  assert set(ssl_lib.HPARAMS) == set(declared)
  assert all(len(fields) == 1 for fields in declared.values()), declared  # One declaration each.
  assert {"temperature", "target_decay", "moco_queue", "cco_lambda",
          "vicreg_invariance"} <= set(ssl_lib.HPARAMS)
  # Every hyperparameter a method reads is declared by some method (or is a model field).
  model_fields = {"predictor"}
  for m in ssl_lib.SSL_METHODS.values():
    assert set(m.hparams) <= set(ssl_lib.HPARAMS) | model_fields, m.name
  # The registry declares none itself.
  assert "Field(" not in pathlib.Path(ssl_lib.__file__).read_text()


def test_a_hyperparameter_declared_twice_differently_is_refused_in_one_line():
  a = ssl_lib.SSLMethod(name="a", loss=None, fields=(Field("temperature", 0.1, "t", lower=0),))
  b = ssl_lib.SSLMethod(name="b", loss=None, fields=(Field("temperature", 0.5, "t", lower=0),))
  assert list(ssl_lib._hparams([a, dataclasses.replace(b, fields=a.fields)])) == ["temperature"]
  with pytest.raises(ValueError, match="'temperature' is declared twice, differently .by 'b'"):
    ssl_lib._hparams([a, b])
