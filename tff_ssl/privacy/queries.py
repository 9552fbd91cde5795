"""The DP queries the aggregators run: `tensorflow_privacy`'s, with reproducible noise, and a form for
records clipped inside a grouped slot.

TFF's `DifferentiallyPrivateFactory` runs a `tfp.DPQuery`: each client's value is clipped
(`preprocess_record`), the records are summed (SumFactory, or a secure sum), and the server adds noise
and normalizes (`get_noised_result`). We keep TFF's factory and tfp's queries and change two things:

* **Seeded noise.** tfp's `GaussianSumQuery` draws its noise from an unseeded random op, so two runs
  of one seed would differ. `SeededQuery` wraps a query: its global state carries a seed (the run's
  seed, a release index, a round counter that advances every release), and every Gaussian query
  inside it draws `tf.random.stateless_normal` from that seed. The noise is fresh every round,
  reproducible, and survives a resume (the seed is in the aggregator state, checkpointed).
* **Records clipped in the slot.** A grouped TFF client slot holds many real clients, and TFF's
  factory would clip the slot's sum. Where `presummed`, the query's `preprocess_record` is the
  identity: the slot has already summed `inner.preprocess_record(params, value_k)` over its real
  clients (`clip_and_sum`), with the params broadcast from this state (`derive_sample_params`). A sum
  of slot sums is the sum of the clients' records, so the result is the same mechanism.
"""

from __future__ import annotations

import collections
import contextlib
import threading

import dp_accounting
import tensorflow as tf
import tensorflow_privacy as tfp

_noise = threading.local()


@contextlib.contextmanager
def _noise_seed(seed):
  """While tracing a `SeededQuery`'s noise: its Gaussian queries draw from `seed` (int64 [2]), each
  from its own stream (fold-in of the order in which they draw)."""
  _noise.seed, _noise.count = seed, 0
  try:
    yield
  finally:
    _noise.seed = None


def _next_seed():
  seed = getattr(_noise, "seed", None)
  if seed is None:
    raise RuntimeError("a seeded Gaussian query drew noise outside SeededQuery.get_noised_result")
  _noise.count += 1
  return tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), _noise.count)


class SeededGaussianSumQuery(tfp.GaussianSumQuery):
  """tfp's Gaussian sum query with its noise drawn from the enclosing `SeededQuery`'s seed."""

  def get_noised_result(self, sample_state, global_state):
    def add_noise(v):
      noise = tf.random.stateless_normal(tf.shape(v), seed=_next_seed(),
                                         stddev=global_state.stddev, dtype=tf.float32)
      return v + tf.cast(noise, v.dtype)

    result = tf.nest.map_structure(add_noise, sample_state)
    event = dp_accounting.GaussianDpEvent(global_state.stddev / global_state.l2_norm_clip)
    return result, global_state, event


def _seed_gaussians(query):
  """Makes every `tfp.GaussianSumQuery` inside `query` (a tfp query tree: normalized, adaptive,
  quantile estimator) draw seeded noise. tfp builds these inner queries in its constructors; their
  class is switched to `SeededGaussianSumQuery`, which changes only where the noise comes from."""
  if type(query) is tfp.GaussianSumQuery:  # pylint: disable=unidiomatic-typecheck
    query.__class__ = SeededGaussianSumQuery
  for name in ("_numerator", "_sum_query", "_quantile_estimator_query", "_below_estimate_query"):
    inner = getattr(query, name, None)
    if isinstance(inner, tfp.DPQuery):
      _seed_gaussians(inner)
  return query


class SeededQuery(tfp.SumAggregationDPQuery):
  """`inner` with seeded noise (module docstring); `presummed`: records arrive clipped and summed
  (`value_specs`: the structure of one client's unclipped value, for the sample state)."""

  _GlobalState = collections.namedtuple("_GlobalState", ["inner", "seed"])

  def __init__(self, inner: tfp.SumAggregationDPQuery, seed, *, presummed: bool = False,
               value_specs=None):
    self.inner = _seed_gaussians(inner)
    self._seed = [int(s) for s in seed]
    self.presummed = presummed
    self._value_specs = value_specs
    if presummed and value_specs is None:
      raise ValueError("a presummed query needs the value's specs (its sample state's template)")

  def initial_global_state(self):
    return self._GlobalState(self.inner.initial_global_state(),
                             tf.constant(self._seed, tf.int64))

  def derive_sample_params(self, global_state):
    return self.inner.derive_sample_params(global_state.inner)

  def initial_sample_state(self, template=None):
    return self.inner.initial_sample_state(self._value_specs if self.presummed else template)

  def preprocess_record(self, params, record):
    return record if self.presummed else self.inner.preprocess_record(params, record)

  def get_noised_result(self, sample_state, global_state):
    with _noise_seed(global_state.seed):
      result, inner_state, event = self.inner.get_noised_result(sample_state, global_state.inner)
    advanced = global_state.seed + tf.constant([0, 1], tf.int64)  # Fresh noise next round.
    return result, self._GlobalState(inner_state, advanced), event

  def derive_metrics(self, global_state):
    return self.inner.derive_metrics(global_state.inner)


def clip_and_sum(query: SeededQuery, params, values, acc=None):
  """`acc` + the record of one real client's `values` (`inner.preprocess_record`): what a grouped
  slot folds over its clients for a presummed query. `acc` None: the first client."""
  record = query.inner.preprocess_record(params, values)
  if acc is None:
    return record
  return tf.nest.map_structure(tf.add, acc, record)


def zero_record(query: SeededQuery, params, value_specs):
  """The empty sum of `clip_and_sum` (zeros of the record's structure)."""
  zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), value_specs)
  return tf.nest.map_structure(tf.zeros_like, query.inner.preprocess_record(params, zeros))
