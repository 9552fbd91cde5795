"""Aggregation strategies on hand-computed values, as TFF's own mean_test.py does.

Three clients of a two-"layer" model unless said otherwise. Expected numbers are derived in the
comments; nothing here is computed by the code under test.
"""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import aggregators
from tff_ssl.aggregators import (FedAvgFactory, LDAWAFactory, LossFactory, MDAWAFactory,
                                 ModelLayout, UniformFactory, divergence)

SCALAR = tff.StructWithPythonType([tff.TensorType(np.float32, [])], list)


def info(n, loss, model):
  return collections.OrderedDict(num_examples=np.float32(n), loss=np.float32(loss),
                                 model=[np.asarray(m, np.float32) for m in model])


def run(factory, value_type, values, infos, rounds=1):
  process = factory.create(value_type, aggregators.client_info_type(value_type))
  state = process.initialize()
  for _ in range(rounds):
    out = process.next(state, values, infos)
    state = out.state
  return [np.asarray(r) for r in out.result], out.measurements


def scalar_clients(values, ns, losses):
  return ([[np.float32(v)] for v in values],
          [info(n, l, [np.float32(0.5)]) for n, l in zip(ns, losses)])


# -- weightings: values 1, 2, 3 -------------------------------------------------------------------
def test_fedavg_weights_by_examples():
  values, infos = scalar_clients([1, 2, 3], [3, 2, 1], [0, 0, 0])
  result, m = run(FedAvgFactory(), SCALAR, values, infos)
  assert result[0] == pytest.approx(10 / 6, rel=1e-6)  # (3*1 + 2*2 + 1*3) / 6.
  assert m["clients"] == 3
  assert m["max_weight"] == pytest.approx(3 / 6, rel=1e-6)


def test_uniform_ignores_examples():
  values, infos = scalar_clients([1, 2, 3], [3, 2, 1], [0, 0, 0])
  result, m = run(UniformFactory(), SCALAR, values, infos)
  assert result[0] == pytest.approx(2.0, rel=1e-6)
  assert m["max_weight"] == pytest.approx(1 / 3, rel=1e-6)


@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_loss_is_a_softmax_of_minus_loss(offset):
  # exp(-L) = 1, 1/2, 1/4 -> weights 4/7, 2/7, 1/7 -> (4 + 4 + 3) / 7. Shifting every loss by 1000
  # (exp(-1000) underflows to 0 in float32) must not change the softmax.
  values, infos = scalar_clients([1, 2, 3], [5, 5, 5],
                                 [offset, offset + math.log(2), offset + math.log(4)])
  result, m = run(LossFactory(), SCALAR, values, infos)
  assert result[0] == pytest.approx(11 / 7, rel=1e-5)
  assert m["max_weight"] == pytest.approx(4 / 7, rel=1e-5)


# -- L-DAWA -----------------------------------------------------------------------------------------
# Layers: "dense" (one kernel tensor of 2), "bias" (1, all-zero in the global model: no angle) and
# "gn" (a GroupNorm scale of 1, a normalization tensor).
DAWA_TYPE = tff.StructWithPythonType([tff.TensorType(np.float32, [2]), tff.TensorType(np.float32, [1]),
                                      tff.TensorType(np.float32, [1])], list)
LAYOUT = ModelLayout(groups=("dense", "bias", "gn"), normalization=(False, False, True))
GLOBAL = [[1.0, 0.0], [0.0], [2.0]]
CLIENTS = [  # w_k per client; Delta_k = w_g - w_k.
    [[2.0, 0.0], [1.0], [1.0]],  # dense cos +1
    [[0.0, 3.0], [2.0], [3.0]],  # dense cos 0 (orthogonal)
    [[-1.0, 1.0], [0.0], [-2.0]],  # dense cos -1/sqrt(2) (negative); bias all zero too
]
R = 1 / math.sqrt(2)


def dawa_inputs(ns=(1, 1, 1), losses=(0.0, 0.0, 0.0)):
  values = [[np.subtract(g, w).astype(np.float32) for g, w in zip(GLOBAL, c)] for c in CLIENTS]
  return values, [info(n, l, GLOBAL) for n, l in zip(ns, losses)]


def global_from(result):
  """w_g - Delta: the new global model that server SGD at learning rate 1 would set."""
  return [np.subtract(g, r) for g, r in zip(GLOBAL, result)]


def test_ldawa_scales_each_layer_by_its_cosine():
  values, infos = dawa_inputs()
  result, m = run(LDAWAFactory(LAYOUT), DAWA_TYPE, values, infos)
  new = global_from(result)
  # dense: (1/3)(1*[2, 0] + 0*[0, 3] + (-R)*[-1, 1]) = [(2 + R) / 3, -R / 3].
  np.testing.assert_allclose(new[0], [(2 + R) / 3, -R / 3], rtol=1e-6)
  # bias: the global layer is zero, so delta = 1 (not NaN): the plain mean (1 + 2 + 0) / 3 = 1.
  np.testing.assert_allclose(new[1], [1.0], rtol=1e-6)
  # gn: a normalization layer takes the plain mean by default: (1 + 3 - 2) / 3.
  np.testing.assert_allclose(new[2], [2 / 3], rtol=1e-6)
  assert all(np.isfinite(r).all() for r in result)
  np.testing.assert_allclose(m["layer_delta"]["dense"], (1 + 0 - R) / 3, rtol=1e-6)
  assert m["layer_delta"]["bias"] == 1.0
  # gn's own cosines (measured though not applied): 2*1/(2*1) = 1, 1, 2*(-2)/(2*2) = -1.
  np.testing.assert_allclose(m["layer_delta"]["gn"], 1 / 3, rtol=1e-6)
  # Whole model: <w_g, w_k> / (|w_g| |w_k|) with |w_g| = sqrt(5): client 1 (2 + 0 + 2) / (sqrt(5)
  # sqrt(6)), client 2 (0 + 0 + 6) / (sqrt(5) sqrt(22)), client 3 (-1 + 0 - 4) / (sqrt(5) sqrt(6)).
  model = (4 / math.sqrt(30) + 6 / math.sqrt(110) - 5 / math.sqrt(30)) / 3
  np.testing.assert_allclose(m["model_delta"], model, rtol=1e-6)
  assert m["max_weight"] == pytest.approx(1 / 3, rel=1e-6)


def test_ldawa_scale_normalization_is_the_authors_code():
  values, infos = dawa_inputs()
  result, _ = run(LDAWAFactory(LAYOUT, scale_normalization=True), DAWA_TYPE, values, infos)
  # gn scaled by cosines 1, 1, -1: (1*1 + 1*3 + (-1)*(-2)) / 3 = 2.
  np.testing.assert_allclose(global_from(result)[2], [2.0], rtol=1e-6)


def test_ldawa_fedavg_and_loss_weightings():
  values, infos = dawa_inputs(ns=(1, 2, 3))
  result, m = run(LDAWAFactory(LAYOUT, weighting="examples"), DAWA_TYPE, values, infos)
  # dense: (1*[2, 0] + 2*0 + 3*(-R)*[-1, 1]) / 6.
  np.testing.assert_allclose(global_from(result)[0], [(2 + 3 * R) / 6, -3 * R / 6], rtol=1e-6)
  assert m["max_weight"] == pytest.approx(3 / 6, rel=1e-6)
  values, infos = dawa_inputs(losses=(0.0, math.log(2), math.log(4)))
  result, _ = run(LDAWAFactory(LAYOUT, weighting="loss"), DAWA_TYPE, values, infos)
  # softmax(-L) = 4/7, 2/7, 1/7: dense (4/7)[2, 0] + (1/7)(-R)[-1, 1].
  np.testing.assert_allclose(global_from(result)[0], [8 / 7 + R / 7, -R / 7], rtol=1e-5)
  # gn (not scaled): (4*1 + 2*3 + 1*(-2)) / 7.
  np.testing.assert_allclose(global_from(result)[2], [8 / 7], rtol=1e-5)


def test_ldawa_fedavg_warmup_rounds():
  values, infos = dawa_inputs(ns=(1, 2, 3))
  factory = LDAWAFactory(LAYOUT, fedavg_warmup_rounds=1)
  result, m = run(factory, DAWA_TYPE, values, infos)  # Round 0: FedAvg.
  fedavg = sum(n * np.asarray(c[0]) for n, c in zip((1, 2, 3), CLIENTS)) / 6  # [0, 9/6].
  np.testing.assert_allclose(global_from(result)[0], fedavg, rtol=1e-6)
  assert m["fedavg_warmup"] == 1.0
  result, m = run(factory, DAWA_TYPE, values, infos, rounds=2)  # Round 1: L-DAWA (uniform).
  np.testing.assert_allclose(global_from(result)[0], [(2 + R) / 3, -R / 3], rtol=1e-6)
  assert m["fedavg_warmup"] == 0.0


def test_layer_and_tensor_granularity():
  # One layer of a kernel [1, 0] and a bias [1]; one client with kernel [1, 1], bias [0].
  value_type = tff.StructWithPythonType([tff.TensorType(np.float32, [2]),
                                         tff.TensorType(np.float32, [1])], list)
  model, client = [[1.0, 0.0], [1.0]], [[1.0, 1.0], [0.0]]
  values = [[np.subtract(g, w).astype(np.float32) for g, w in zip(model, client)]]
  infos = [info(1, 0.0, model)]
  layer = ModelLayout(groups=("dense", "dense"), normalization=(False, False))
  result, _ = run(LDAWAFactory(layer), value_type, values, infos)
  # Layer cosine: <[1,0,1], [1,1,0]> / (sqrt 2 sqrt 2) = 1/2 -> new layer = [0.5, 0.5], [0].
  np.testing.assert_allclose(result[0], [0.5, -0.5], rtol=1e-6)
  np.testing.assert_allclose(result[1], [1.0], rtol=1e-6)
  result, m = run(LDAWAFactory(ModelLayout.per_tensor(2)), value_type, values, infos)
  # Per tensor: kernel cos 1/sqrt 2 -> [R, R]; the client's bias is zero -> delta 1 -> [0].
  np.testing.assert_allclose(result[0], [1 - R, -R], rtol=1e-6)
  np.testing.assert_allclose(result[1], [1.0], rtol=1e-6)
  assert list(m["layer_delta"]) == ["tensor0", "tensor1"]


def test_mdawa_uses_one_cosine_for_the_whole_model():
  values, infos = dawa_inputs()
  result, m = run(MDAWAFactory(3), DAWA_TYPE, values, infos)
  # Whole-model cosines (see test_ldawa_scales_each_layer_by_its_cosine): c1 = 4/sqrt(30),
  # c2 = 6/sqrt(110), c3 = -5/sqrt(30); every tensor, gn included, is scaled by the client's one.
  c = [4 / math.sqrt(30), 6 / math.sqrt(110), -5 / math.sqrt(30)]
  for t in range(3):
    want = sum(ck * np.asarray(client[t]) for ck, client in zip(c, CLIENTS)) / 3
    np.testing.assert_allclose(global_from(result)[t], want, rtol=1e-5)
  np.testing.assert_allclose(m["model_delta"], sum(c) / 3, rtol=1e-6)


def test_zero_update_and_zero_model_give_no_nan():
  value_type = tff.StructWithPythonType([tff.TensorType(np.float32, [3])], list)
  zero = [np.zeros(3, np.float32)]
  result, m = run(LDAWAFactory(ModelLayout.per_tensor(1)), value_type, [zero, zero],
                  [info(1, 0.0, zero), info(2, 0.0, zero)])
  np.testing.assert_array_equal(result[0], np.zeros(3))
  assert m["model_delta"] == 1.0


# -- composition with TFF's factories, and types ----------------------------------------------------
def test_composes_with_tff_clipping_factory():
  # Clipping to norm 1 acts on Delta_k before L-DAWA: w_g = [1, 0], Delta = [0, -2] -> [0, -1], so
  # w_k = [1, 1] and delta = 1/sqrt 2: new global R * [1, 1].
  value_type = tff.StructWithPythonType([tff.TensorType(np.float32, [2])], list)
  factory = tff.aggregators.clipping_factory(1.0, LDAWAFactory(ModelLayout.per_tensor(1)))
  result, m = run(factory, value_type, [[np.array([0.0, -2.0], np.float32)]],
                  [info(1, 0.0, [[1.0, 0.0]])])
  np.testing.assert_allclose(result[0], [1 - R, -R], rtol=1e-6)
  assert m["clipped_count"] == 1
  # Uniform mean of [3, 4] clipped to [0.6, 0.8] and [0.3, 0.4] (not clipped).
  factory = tff.aggregators.clipping_factory(1.0, UniformFactory())
  values = [[np.array([3.0, 4.0], np.float32)], [np.array([0.3, 0.4], np.float32)]]
  result, _ = run(factory, value_type, values, [info(1, 0.0, [[0.0, 0.0]])] * 2)
  np.testing.assert_allclose(result[0], [0.45, 0.6], rtol=1e-6)


def test_inner_factory_replaces_the_weighted_mean():
  # The inner factory receives (v_k, b_k): a MeanFactory with an explicit inner sum gives the same
  # mean; an unweighted inner factory is refused.
  with pytest.raises(TypeError, match="inner must be a weighted"):
    FedAvgFactory(inner=tff.aggregators.SumFactory())
  values, infos = scalar_clients([1, 2, 3], [3, 2, 1], [0, 0, 0])
  inner = tff.aggregators.MeanFactory(value_sum_factory=tff.aggregators.SumFactory())
  result, _ = run(FedAvgFactory(inner=inner), SCALAR, values, infos)
  assert result[0] == pytest.approx(10 / 6, rel=1e-6)
  # The softmax weighting computes its weighted mean in one mergeable aggregate: no inner factory.
  with pytest.raises(TypeError, match="an inner factory cannot take its place"):
    LossFactory(inner=inner).create(SCALAR, aggregators.client_info_type(SCALAR))


def test_type_signatures():
  value_type = DAWA_TYPE
  info_type = aggregators.client_info_type(value_type)
  process = LDAWAFactory(LAYOUT).create(value_type, info_type)
  sig = process.next.type_signature
  assert sig.parameter[1] == tff.FederatedType(value_type, tff.CLIENTS)
  assert sig.parameter[2] == tff.FederatedType(info_type, tff.CLIENTS)
  assert sig.result.result == tff.FederatedType(value_type, tff.SERVER)
  assert sig.result.measurements.placement == tff.SERVER
  layer_delta = sig.result.measurements.member.layer_delta
  assert [name for name, _ in tff.structure.to_elements(layer_delta)] == ["dense", "bias", "gn"]
  grouped = LDAWAFactory(LAYOUT).create_grouped(value_type)
  assert grouped.next.type_signature.parameter[1] == tff.FederatedType(
      LDAWAFactory(LAYOUT).contribution_type(value_type), tff.CLIENTS)
  assert grouped.initialize.type_signature == process.initialize.type_signature
  with pytest.raises(TypeError, match="weighs clients by their ClientInfo"):
    FedAvgFactory().create(value_type, tff.TensorType(np.float32))


def test_bad_options_are_refused():
  with pytest.raises(ValueError, match="unknown weighting 'median'"):
    LDAWAFactory(LAYOUT, weighting="median")
  with pytest.raises(ValueError, match="fedavg_warmup_rounds must be >= 0"):
    LDAWAFactory(LAYOUT, fedavg_warmup_rounds=-1)
  with pytest.raises(ValueError, match="unknown aggregator 'fedprox'"):
    aggregators.AggregatorConfig(name="fedprox")
  with pytest.raises(ValueError, match="layout describes 2 tensors but the model has 3"):
    run(LDAWAFactory(ModelLayout.per_tensor(2)), DAWA_TYPE, *dawa_inputs())


def test_in_slot_accumulation_equals_one_client_at_a_time():
  """`accumulate` (a slot's running log-sum-exp mean) over clients of very different log weights
  equals the directly computed weighted mean, and its log weight is log sum b_k."""
  factory = LossFactory()
  specs = [tf.TensorSpec([2], tf.float32)]
  acc = factory.initial_accumulator(specs)
  values = [np.array([1.0, -1.0]), np.array([2.0, 0.0]), np.array([5.0, 5.0])]
  log_w = [-900.0, -899.0, -905.0]  # exp underflows in float32 without a shift.
  for v, lw in zip(values, log_w):
    acc = factory.accumulate(acc, [tf.constant(v, tf.float32)], [tf.constant(1.0)],
                             tf.constant(lw), collections.OrderedDict(clients=tf.constant(1.0)))
  acc = factory.finalize(acc, [tf.constant([7.0, 7.0])])  # w_g: no term for FedAvg-style values.
  b = np.exp(np.array(log_w) - max(log_w))
  want = sum(bk * v for bk, v in zip(b, values)) / b.sum()
  np.testing.assert_allclose(acc.value[0].numpy(), want, rtol=0, atol=1e-6 * np.abs(want).max())
  np.testing.assert_allclose(acc.log_weight.numpy(), max(log_w) + np.log(b.sum()), rtol=1e-7)
  assert acc.max_log_weight.numpy() == -899.0
  assert acc.stats["clients"].numpy() == 3.0


def test_in_slot_accumulation_of_scaled_values():
  """The factored fold of DAWA values v_k = (1 - s_k) w_g + s_k Delta_k: two clients, two tensors,
  weights 1 and 3, by hand: tensor 0 (s = 0.5, -1): v = (1.5, 2.5), (9, 11); mean (1.5 + 3 * 9) / 4,
  (2.5 + 3 * 11) / 4. Tensor 1 (s = 1, 1): v = Delta, mean (1 + 3 * 5) / 4."""
  factory = LDAWAFactory(ModelLayout.per_tensor(2))
  specs = [tf.TensorSpec([2], tf.float32), tf.TensorSpec([1], tf.float32)]
  w_g = [tf.constant([2.0, 3.0]), tf.constant([4.0])]
  deltas = [[tf.constant([1.0, 2.0]), tf.constant([1.0])],
            [tf.constant([-5.0, -5.0]), tf.constant([5.0])]]
  scales = [[tf.constant(0.5), tf.constant(1.0)], [tf.constant(-1.0), tf.constant(1.0)]]
  stats = collections.OrderedDict(clients=tf.constant(1.0), model_delta=tf.constant(0.0),
                                  layer_delta=tf.zeros([2]), fedavg_warmup=tf.constant(0.0))
  acc = factory.initial_accumulator(specs)
  for d, sc, lw in zip(deltas, scales, (0.0, np.log(3.0))):
    acc = factory.accumulate(acc, d, sc, tf.constant(lw, tf.float32), stats)
  out = factory.finalize(acc, w_g)
  np.testing.assert_allclose(out.value[0].numpy(), [28.5 / 4, 35.5 / 4], rtol=1e-6)
  np.testing.assert_allclose(out.value[1].numpy(), [(1.0 + 15.0) / 4], rtol=1e-6)
  np.testing.assert_allclose(out.log_weight.numpy(), np.log(4.0), rtol=1e-6)
  # The same as each client's own `client_stage` value, averaged.
  v = [divergence.scaled_update(d, w_g, sc) for d, sc in zip(deltas, scales)]
  np.testing.assert_allclose(out.value[0].numpy(), (v[0][0] + 3 * v[1][0]).numpy() / 4, rtol=1e-6)
