"""Aggregation cost: one aggregation of a round's client updates by each strategy
(`tff_ssl.aggregators`), timed as the server's stage, as the strategy's TFF aggregation process and
as a grouped slot's arithmetic (`time_aggregation`; `bin/benchmark --aggregation`)."""

from __future__ import annotations

import collections
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import aggregators, models
from tff_ssl.benchmarks.common import median_time, ratio, tiny_model
from tff_ssl.federated import common
from tff_ssl.federated.functional import FunctionalModel

AGGREGATION_FIELDS = ("strategy", "clients", "parameters", "server_stage_s", "server_stage_ratio",
                      "tff_process_s", "tff_process_ratio", "client_stage_s", "client_stage_ratio",
                      "tff_total_s", "tff_make_values_s")


def ldawa_model(image_shape) -> Callable[[], tf.keras.Model]:
  """The L-DAWA paper's model: ResNet-18 (GroupNorm + WS here) + SimCLR projector [2048, 128]."""
  def build():
    enc = models.build_encoder("resnet18", image_shape, width=1.0, small_input=True)
    x = tf.keras.Input(image_shape)
    return tf.keras.Model(x, models.build_mlp_head(enc.output_shape[-1], (2048, 128))(enc(x)))
  return build


AGGREGATION_MODELS = {"resnet18": ldawa_model, "tiny": tiny_model}


def _value_makers(specs, scales):
  """Plain TF functions that make the clients' values cheaply (also run inside the TFF worker).

  Aggregation arithmetic does not depend on the values, so they are made at memset speed, keeping the
  time to make them (subtracted from the measurements, with its noise) small: `make_global()`: a
  global model w_g and a direction D, each tensor constant (its scale). `make_client(g, k)`: client
  k's update Delta_k = a_k D + b_k w_g and its ClientInfo (N_k = 100 + 50 k, L_k = 5 + 0.1 k, the
  model w_g).
  """
  def make_global():
    return collections.OrderedDict(
        w=[tf.fill(spec.shape, s) for spec, s in zip(specs, scales)],
        d=[tf.fill(spec.shape, -1e-2 * s) for spec, s in zip(specs, scales)])

  def make_client(g, k):
    k_f = tf.cast(k, tf.float32)
    a, b = tf.cos(0.3 * k_f), 1e-2 * (tf.sin(0.3 * k_f) + 0.5)
    update = [a * d + b * w for d, w in zip(g["d"], g["w"])]
    return collections.OrderedDict(update=update, info=collections.OrderedDict(
        num_examples=100.0 + 50.0 * k_f, loss=5.0 + 0.1 * k_f, model=list(g["w"])))

  return make_global, make_client


def time_aggregation(model_builder, strategies, *, clients: int = 10, warmup: int = 2,
                     repeats: int = 5, log=print) -> list[dict]:
  """Median time of one aggregation of `clients` client updates by each strategy, three ways:

    server_stage  what the server computes (`create_grouped`): the weighted mean of the values the
                  clients send, each having computed its own value and weight (for the DAWA family,
                  its layer angles: a client holds w_g and w_k). Net of making the values, as below.

    tff_process   the strategy's TFF aggregation process (`factory.create(...).next`) in the TFF
                  worker, reference simulation (one TFF client per client; what a deployment runs):
                  the per-client stage at CLIENTS, then the weighted mean at the server. The clients'
                  values are made inside the worker (a model broadcast, each client's update
                  from its index), so that no 10 x 2 models cross from Python (≈ 35 s for
                  ResNet-18, the same for every strategy); the time to make them (`tff_make_values_s`, the same computation without the
                  aggregation) is subtracted from the total (`tff_total_s`).
    client_stage  the per-client stage and the fold of every client into the weighted mean as one
                  `tf.function` (what a grouped slot computes): the arithmetic alone.

  Ratios are to the first strategy (FedAvg).
  """
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(model_builder)
  w_type = common.weights_type(model)
  info_type = aggregators.client_info_type(w_type)
  specs = list(model.weight_specs)
  scales = [float(np.abs(w).mean()) + 1e-3 for w in model.initial_weights]
  params = sum(int(np.prod(s.shape)) for s in specs)
  make_global_tf, make_client_tf = _value_makers(specs, scales)
  make_global = tff.tensorflow.computation(make_global_tf)
  global_type = make_global.type_signature.result
  make_client = tff.tensorflow.computation(make_client_tf, global_type, np.int32)

  @tff.tensorflow.computation(make_client.type_signature.result)
  def checksum_values(v):  # Forces the values to be made; returns one number.
    return tf.add_n([tf.reduce_sum(u) for u in v["update"]] +
                    [tf.reduce_sum(w) for w in v["info"]["model"]] + [v["info"]["loss"]])

  @tff.tensorflow.computation(w_type)
  def checksum_result(w):
    return tf.add_n([tf.reduce_sum(t) for t in w])

  def made_at_clients(ks):
    g = tff.federated_broadcast(tff.federated_eval(make_global, tff.SERVER))
    return tff.federated_map(make_client, (g, ks))

  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def make_only(ks):
    return tff.federated_sum(tff.federated_map(checksum_values, made_at_clients(ks)))

  ks = list(range(clients))
  g = make_global_tf()  # The same values in Python, for the client-stage timing.
  updates_t = [make_client_tf(g, k)["update"] for k in ks]
  global_t = list(g["w"])
  make_s = median_time(lambda r: make_only(ks), warmup, repeats)
  log(f"  making {clients} clients' values in the TFF worker: {make_s:.3f} s")
  rows = []
  for name in strategies:
    factory = aggregators.AggregatorConfig(name=name).build(model)
    process = factory.create(w_type, info_type)

    aggregate = _aggregate_made_values(process, made_at_clients, checksum_result)
    state = process.initialize()
    total_s = median_time(lambda r, aggregate=aggregate: aggregate(state, ks), warmup, repeats)
    server_only = _server_stage_of_made_values(factory, w_type, specs, make_client,
                                               made_at_clients, checksum_result)
    server_state = factory.create_grouped(w_type).initialize()
    server_s = median_time(lambda r, server_only=server_only: server_only(server_state, ks),
                            warmup, repeats)
    fold = _fold_function(factory, specs, clients)
    n = tf.constant([100.0 + 50.0 * k for k in ks])
    losses_t = tf.constant([5.0 + 0.1 * k for k in ks])
    stage_s = median_time(lambda r, fold=fold: fold(updates_t, global_t, n, losses_t)[0].numpy(),
                           warmup, repeats)
    rows.append({"strategy": name, "clients": clients, "parameters": params,
                 "server_stage_s": max(server_s - make_s, 0.0),
                 "tff_process_s": max(total_s - make_s, 0.0), "client_stage_s": stage_s,
                 "tff_total_s": total_s, "tff_make_values_s": make_s})
    log(f"  {name}: server stage {server_s - make_s:.3f} s, TFF process {total_s - make_s:.3f} s "
        f"(total {total_s:.3f} s), client stage {stage_s:.3f} s")
  for row in rows:
    # A stage's time is a difference of medians; where noise makes the first row's 0 (a loaded
    # machine, one round), its ratios are unmeasured (NaN), not 0 or a division by 1e-9.
    row["server_stage_ratio"] = ratio(row["server_stage_s"], rows[0]["server_stage_s"])
    row["tff_process_ratio"] = ratio(row["tff_process_s"], rows[0]["tff_process_s"])
    row["client_stage_ratio"] = ratio(row["client_stage_s"], rows[0]["client_stage_s"])
  return rows


def _aggregate_made_values(process, made_at_clients, checksum_result):
  """One aggregation by `process` of values made at CLIENTS from their index; returns a checksum."""
  @tff.federated_computation(process.initialize.type_signature.result,
                             tff.FederatedType(np.int32, tff.CLIENTS))
  def aggregate(state, ks):
    values = made_at_clients(ks)
    out = process.next(state, values.update, values.info)
    return tff.federated_map(checksum_result, out.result)
  return aggregate


def _server_stage_of_made_values(factory, w_type, specs, make_client, made_at_clients,
                                 checksum_result):
  """The strategy's server stage alone (`create_grouped`: the weighted mean of what clients send,
  after each computed its own value and weight), on values made at CLIENTS; returns a checksum."""
  server = factory.create_grouped(w_type)
  stats_specs = factory.stats_spec(specs)

  @tff.tensorflow.computation(make_client.type_signature.result)
  def as_contribution(v):
    info = v["info"]
    log_weight = aggregators.base.base_log_weight(factory.weighting, info["num_examples"],
                                                  info["loss"])
    return collections.OrderedDict(
        value=list(v["update"]), log_weight=log_weight, max_log_weight=log_weight,
        stats=collections.OrderedDict((k, tf.zeros(sp.shape, sp.dtype))
                                      for k, sp in stats_specs.items()))

  @tff.federated_computation(server.initialize.type_signature.result,
                             tff.FederatedType(np.int32, tff.CLIENTS))
  def server_only(state, ks):
    contributions = tff.federated_map(as_contribution, made_at_clients(ks))
    return tff.federated_map(checksum_result, server.next(state, contributions).result)
  return server_only


def _fold_function(factory, specs, clients: int):
  """A grouped slot's arithmetic: every client's stage folded into the weighted mean."""

  @tf.function
  def fold(updates_t, global_t, n, losses_t):
    acc = factory.initial_accumulator(specs)
    for k in range(clients):
      scale, log_weight, stats = factory.client_terms(
          updates_t[k], aggregators.ClientInfo(n[k], losses_t[k], global_t), tf.constant(0))
      acc = factory.accumulate(acc, updates_t[k], scale, log_weight, stats)
    return factory.finalize(acc, global_t).value
  return fold


def format_aggregation_table(rows: list[dict]) -> str:
  lines = [f"Aggregation of {rows[0]['clients']} client updates of {rows[0]['parameters']:,} "
           f"parameters (median; server stage and TFF process: net of {rows[0]['tff_make_values_s']:.3f} s to make "
           f"the clients' values in the worker):", "",
           "| strategy | server stage s | ÷ FedAvg | TFF aggregation process s | ÷ FedAvg "
           "| client stage + mean (tf.function) s | ÷ FedAvg |", "|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['strategy']} | {r['server_stage_s']:.3f} | {r['server_stage_ratio']:.2f} | "
                 f"{r['tff_process_s']:.3f} | {r['tff_process_ratio']:.2f} | "
                 f"{r['client_stage_s']:.3f} | {r['client_stage_ratio']:.2f} |")
  return "\n".join(lines)
