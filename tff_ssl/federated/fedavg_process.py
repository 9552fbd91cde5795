"""The FedAvg-style process: any client SSL method (`tff_ssl.ssl`) with any aggregation strategy
(`tff_ssl.aggregators`), any client terms and server stages; the host of every FedAvg-style method
(`tff_ssl/methods/`: FedAvg, FedProx, the FedSSL family, FedLAMA, the layer-wise methods).

    SERVER  w, seed_r, aggregator state                      CLIENTS k = 1..K
    ─────────────────────────────────────────────────────────────────────────────────────────────
      w, seed_r ──federated_broadcast──►  local training from w: E epochs over x_k in batches of B
                                          (full batch: one step per epoch); new views each step,
                                          keyed by (seed_r, step, ids_k); loss = the SSL method's
                                          (BYOL: target = EMA of the online weights over the steps)
                                          Delta_k = w - w_k,  info_k = <N_k, mean loss L_k, w>
      Delta, measurements = aggregator(Delta_k, info_k)  ◄──  (default FedAvg: N_k-weighted mean)
    server: w ← server_optimizer(w, gradient=Delta)

The DCCO paper's FedAvg baselines (CCO / contrastive with within-client losses, one full-batch local
step) and the L-DAWA paper's cross-silo runs (SimCLR / Barlow Twins, E = 10 epochs of batch 256, SGD
with momentum and weight decay, strategies FedAvg / Loss / L-DAWA...) are both this process. One
federated computation per round (`run_round`); the server optimizer step runs on the server in
Python. We do not use `tff.learning.templates.compose_learning_process`: its client work consumes
`tf.data` batches of (x, y) through a `tff.learning` model with a supervised loss, while an SSL client
takes its images as one tensor, makes two views and needs no labels.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import aggregators
from tff_ssl.aggregators import ClientInfo
from tff_ssl.federated import client_state as client_state_lib
from tff_ssl.federated import local_steps
from tff_ssl.federated import masks
from tff_ssl.federated import server_step
from tff_ssl.federated import client_work, common, composer, grouping, round_parts
from tff_ssl.federated import server_stage as server_stage_lib
from tff_ssl.federated.client_work import ClientConfig, initial_ssl_state, view_outputs
from tff_ssl.federated.functional import FunctionalModel


def check_outputs(model: FunctionalModel, config: ClientConfig) -> None:
  """ValueError unless `model` has the outputs the SSL method and the client terms read."""
  method = config.method
  outputs = 1 + int(config.predictions) + int(config.needs_features)
  if len(model.output_dims) < outputs:
    with_terms = "".join(f" with {t.key}" for t in config.terms if t.features)
    raise ValueError(
        f"{method.name}{with_terms} needs a model with {outputs} output(s) (projection"
        f"{', prediction' if config.predictions else ''}"
        f"{', encoder features' if config.needs_features else ''}); this one has "
        f"{len(model.output_dims)}")


def _aggregator(factory, simulation: grouping.Simulation, specs, u_type):
  """(The round's aggregation process, whether a grouped slot's contribution crosses the TFF
  boundary as one flat vector)."""
  if simulation.grouped:
    if not isinstance(factory, aggregators.StrategyFactory):
      raise ValueError(f"the grouped simulation runs the aggregation strategy's per-client stage "
                       f"inside each client slot, so it needs a tff_ssl.aggregators strategy; got "
                       f"{type(factory).__name__}. Use simulation mode 'reference' for other "
                       f"tff.aggregators factories")
    # A slot's contribution crosses the TFF boundary as one flat vector where the server stage is
    # elementwise (every strategy's own weighted mean; not a user's inner factory), as the
    # broadcast does.
    flat = factory.elementwise_server_stage
    return factory.create_grouped(tff.StructType([common.flat_type(specs)]) if flat
                                  else u_type), flat
  try:
    return factory.create(u_type, aggregators.client_info_type(u_type)), False
  except TypeError as e:
    raise ValueError(f"aggregation_factory must weigh clients by their ClientInfo "
                     f"(tff_ssl.aggregators); {type(factory).__name__} failed: {e}") from None


def batched_group_update(model: FunctionalModel, cfg: ClientConfig, factory, mask, weights, seed,
                         data):
  """A grouped slot's round in one batched pass, where every client takes one full-batch step of
  the plain SSL loss. One (first) step of the client optimizer is linear in the gradient, so
  sum_k b_k Delta_k / sum_k b_k = eta grad(sum_k b_k L_k / sum_k b_k), with b_k from the per-client
  losses at the broadcast weights (held fixed): one batched forward/backward pass. Returns (the
  slot's `Contribution`, its mean loss, N)."""
  method = cfg.method
  n = tf.cast(data.sizes, tf.float32)
  v1, v2 = common.views(data, seed, cfg.augment)
  per_client = {}

  def objective(current, step):
    del step  # One step.
    losses_k = method.losses_per_client(view_outputs(model, method, current, None, v1, v2,
                                                     initial_ssl_state(model, cfg).get("queue")),
                                        data.sizes, cfg.hparams)
    log_b = tf.stop_gradient(aggregators.base.base_log_weight(factory.weighting, n, losses_k))
    b = tf.exp(log_b - tf.reduce_max(log_b))
    per_client.update(losses=losses_k, log_b=log_b)
    return tf.reduce_sum(b * losses_k) / tf.reduce_sum(b)

  delta, _, _ = local_steps.train(weights, 1, cfg.client_optimizer, cfg.client_learning_rate,
                                      objective, weight_decay=cfg.client_weight_decay, mask=mask)
  log_b, losses_k = per_client["log_b"], per_client["losses"]
  top = tf.reduce_max(log_b)
  contribution = aggregators.Contribution(
      delta, top + tf.math.log(tf.reduce_sum(tf.exp(log_b - top))), top,
      collections.OrderedDict(clients=tf.cast(tf.shape(n)[0], tf.float32)))
  return contribution, tf.reduce_sum(n * losses_k) / tf.reduce_sum(n), tf.reduce_sum(n)


def _check_wire(factory, parts, config: ClientConfig, model) -> None:
  """ValueError where the clients' reports would leave them beside a private or secure upload."""
  wire = factory.wire if isinstance(factory, aggregators.StrategyFactory) else None
  if wire is not None and (wire.enabled or wire.secure_aggregation) and parts.reports:
    term = client_work.reporting_terms(config, model)[0]
    flag = "--dp" if wire.enabled else "--secure_aggregation"
    left = "without noise" if wire.enabled else "in the clear"
    raise ValueError(f"{flag} refuses {term.key}: its clients upload a report beside their "
                     f"update, which would leave them {left}; drop one of the two")


def _round(process, client_update, w_type, image_shape) -> composer.Round:
  """A FedAvg-style round: one phase, the clients' `client_update` and the process's aggregator
  (`run_round`'s parameters and results: the class docstring)."""
  parts, all_specs = process.parts, process.model.weight_specs

  @tff.tensorflow.computation(w_type)
  def select_trained(weights):
    return process.mask.select(common.unflatten_tensors(weights, all_specs))

  grouped = process.simulation.grouped
  rest = 3 if grouped else 4  # The reference client also returns its mean loss.

  def info(out, at):  # Reference mode: each client's ClientInfo, the weight of its update.
    return tff.federated_zip(collections.OrderedDict(
        num_examples=out[2], loss=out[3],
        model=tff.federated_map(select_trained, at["weights"])))

  def results(aggregated, out, names):
    del names
    result = collections.OrderedDict(update=aggregated.result,
                                     loss=tff.federated_mean(out[1], weight=out[2]),
                                     measurements=aggregated.measurements)
    if parts.stateful:
      result["client_states"] = out[rest]  # Stay at the clients.
    if parts.reports:  # Uploaded: every client's (id, report), at the server.
      result["reports"] = parts.collect_reports(out[rest + int(parts.stateful)])
    return result

  outputs = (("update", "loss", "measurements") + (("client_states",) if parts.stateful else ())
             + (("reports",) if parts.reports else ()))
  # A grouped slot's clients read the strategy's client argument of its state ("params").
  aggregation = composer.Factory(process.aggregator,
                                 params=process.factory.client_argument if grouped else None)
  phase = composer.Phase(
      "update", client_update,
      ("weights", "seed", "data") + (("params",) if grouped else ()) +
      (("extra",) if parts.any else ()), aggregation, outputs, results,
      weight=None if grouped else info)
  arguments = list(tff.structure.iter_elements(parts.parameter([
      ("weights", tff.FederatedType(w_type, tff.SERVER)),
      ("seed", tff.FederatedType(common.SEED_TYPE, tff.SERVER)),
      ("data", tff.FederatedType(
          grouping.group_input_type(image_shape) if grouped
          else common.client_input_type(image_shape), tff.CLIENTS))])))
  return composer.Round(arguments, [phase], outputs,
                        derived=[("extra", parts.at_clients)] if parts.any else [])


class FedAvgSSLProcess(server_step.ServerLoop):
  """FedAvg-style rounds; same interface as `DCCOProcess`.

    run_round: (<weights, seed[, context]@SERVER, aggregator_states=<update=...>@SERVER,
                 data[, states][, ids]@CLIENTS>
                -> <update, loss, measurements>@SERVER[, client_states@CLIENTS][, reports@SERVER],
                   aggregator_states@SERVER)
    one phase of the composer (`federated.composer`, `_round`), SERVER parameters first.

  w crosses the TFF boundary as one flat vector (`common.flat_weights`); so does a grouped slot's
  update where the strategy's server stage is elementwise (`compute_update` gives the tensors back).

  `aggregation_factory`: a `tff_ssl.aggregators.StrategyFactory` (default FedAvg), whose weight
  argument is each client's `ClientInfo`. In reference mode (one real client per TFF client slot)
  any weighted `tff.aggregators` factory over that weight works, e.g. TFF's
  `clipping_factory(norm, aggregators.LDAWAFactory(...))`. In grouped mode (the default) a slot
  carries many real clients, runs the strategy's per-client stage for each of them and hands the
  server stage one folded `Contribution` (`aggregators.base`): the same result as reference mode,
  which is why grouped mode takes a `StrategyFactory` itself (a TFF factory wrapped around it would
  see a slot's partial sum, not a client).

  `mask`: the tensors trained and exchanged (default all). The clients receive the whole model (the
  frozen tensors are needed for the forward pass) and upload Delta_k of the trained tensors only;
  the aggregator and the server optimizer see only those, so frozen tensors stay bit-identical.

  `client_state`: a `client_state.ClientState` makes the process stateful: each sampled client's
  state goes in as a CLIENTS-placed value, its local training starts from `begin(state, w)`, it
  uploads Delta_k = w - (its trained weights) and keeps `end(...)`. `next` then needs the clients'
  ids and a `ClientStateStore`. A client state with a `context_spec` also receives, broadcast, what
  its server stages give.

  `stages`: the method's server-side plug-ins (`server_stage.ServerStage`): each has its part of the
  method state, broadcasts its context, provides or wraps the client state, adds its client terms,
  may choose the aggregation factory, and takes the round's aggregate before and after the server
  optimizer step; they are folded in by `server_stage.fold`, which refuses orders that would matter.
  """

  def __init__(self, model: FunctionalModel, image_shape: Sequence[int],
               server_optimizer: tff.learning.optimizers.Optimizer,
               config: ClientConfig = ClientConfig(),
               aggregation_factory: tff.aggregators.WeightedAggregationFactory | None = None,
               simulation: grouping.Simulation = grouping.Simulation(),
               mask: masks.TensorMask | None = None,
               client_state: client_state_lib.ClientState | None = None,
               stages: Sequence[server_stage_lib.ServerStage] = ()):
    super().__init__(model, server_optimizer, mask=mask)
    self.stages = tuple(stages)
    client_state, config, aggregation_factory = server_stage_lib.fold(
        self.stages, model, client_state, config, aggregation_factory)
    check_outputs(model, config)
    self.config, self.simulation, self.client_state = config, simulation, client_state
    self.parts = parts = round_parts.RoundParts(client_state, config, model, simulation.grouped)
    if client_state is not None:
      self._initial_client_state = client_state.initial(model)
    self.factory = factory = (aggregation_factory if aggregation_factory is not None
                              else aggregators.FedAvgFactory())
    _check_wire(factory, parts, config, model)
    all_specs, specs = model.weight_specs, self.trained_specs
    w_type = common.flat_type(all_specs)  # The broadcast crosses the TFF boundary as one vector.
    u_type = common.tensors_type(specs)  # The upload: the trained tensors' Delta_k.
    self.aggregator, self._flat_upload = _aggregator(factory, simulation, specs, u_type)
    self._aggregator = self.aggregator
    client_update = (self._grouped_client_update(w_type, image_shape) if simulation.grouped
                     else self._reference_client_update(w_type, image_shape))

    self.round = _round(self, client_update, w_type, image_shape)
    self.client_update = client_update
    self.run_round = self.round.computation()

  def _grouped_client_update(self, w_type, image_shape):
    """A grouped slot's computation: (its folded `Contribution`, mean first-step loss, N[, its
    clients' new states[, their reports]])."""
    model, cfg, mask, factory, parts = (self.model, self.config, self.mask, self.factory,
                                        self.parts)
    batched = (self.simulation.batch_one_step and cfg.local_steps == 1 and
               not cfg.local_batch_size and not factory.needs_client_updates and
               not parts.any and not cfg.terms and cfg.head_norm == "group" and
               cfg.view_pairs == 1)
    specs = self.trained_specs

    def looped(weights, seed, data, round_num, extra):
      states, context, ids = parts.unpack(extra)

      def one_client(images, ids_k, state, client_id, acc):
        delta, first_loss, mean_loss, n, new_state, report = client_work.client_round(
            model, cfg, self.client_state, weights, seed, {"images": images, "ids": ids_k}, state,
            context, client_id, mask)
        acc_k = factory.fold(acc[0], delta, ClientInfo(n, mean_loss, mask.select(weights)),
                             round_num)
        return (acc_k, acc[1] + n * first_loss, acc[2] + n), new_state, report

      zero = tf.constant(0.0)
      (acc, loss_sum, n), outputs = parts.fold(
          data, one_client, (factory.initial_accumulator(specs), zero, zero), states, ids)
      return factory.finalize(acc, mask.select(weights)), loss_sum / n, n, outputs

    def client_update(weights, seed, data, round_num, extra):
      weights = common.unflatten_tensors(weights, model.weight_specs)
      if batched:
        contribution, loss, n = batched_group_update(model, cfg, factory, mask, weights, seed,
                                                     data)
        outputs = ()
      else:  # + (the clients' new states) + (their reports), where the round has them.
        contribution, loss, n, outputs = looped(weights, seed, data, round_num, extra)
      if self._flat_upload:
        contribution = contribution._replace(value=[common.flatten(contribution.value)])
      out = (factory.as_upload(contribution), loss, n)
      return out + tuple(outputs)

    return parts.tensorflow_computation(client_update, [
        ("weights", w_type), ("seed", common.SEED_TYPE),
        ("data", grouping.group_input_type(image_shape)),
        ("round_num", factory.client_argument_type(common.tensors_type(specs)))])

  def _reference_client_update(self, w_type, image_shape):
    """One real client's computation: (Delta_k, first-step loss, N_k, mean loss[, new state[, its
    report as a one-client stack]])."""
    model, cfg, mask, parts = self.model, self.config, self.mask, self.parts

    def client_update(weights, seed, data, extra):
      states, context, ids = parts.unpack(extra)
      weights = common.unflatten_tensors(weights, model.weight_specs)
      delta, first_loss, mean_loss, n, new_state, report = client_work.client_round(
          model, cfg, self.client_state, weights, seed, data, states, context, ids, mask)
      out = (delta, first_loss, n, mean_loss)
      if parts.stateful:
        out += (new_state,)
      if parts.reports:  # The report as a one-client stack, as a grouped slot's.
        out += (tf.nest.map_structure(lambda x: x[None], report),)
      return out

    return parts.tensorflow_computation(client_update, [
        ("weights", w_type), ("seed", common.SEED_TYPE),
        ("data", common.client_input_type(image_shape))])

  def compute_update(self, state: server_step.ServerState, clients: list[dict],
                     client_states: list | None = None,
                     client_ids: Sequence[int] | None = None) -> dict:
    """The round's aggregated update, mean client loss, aggregator state and measurements (and the
    clients' new states, for a stateful process, and the clients' reports, `reports`: each a NumPy
    array with a leading axis over the round's clients, `client` their ids), before the server
    optimizer step."""
    if not clients:
      raise ValueError("a FedAvg round needs at least one client")
    need = self.config.min_samples
    small = [len(c["ids"]) for c in clients if len(c["ids"]) < need]
    if small:
      what = (f"{self.config.ssl}'s within-client loss" if need == self.config.method.min_samples
              else "batch-statistics heads")
      raise ValueError(f"{what} needs >= {need} images per client; got a client with {small[0]}. "
                       f"Use DCCO for one-image clients")
    grouped = self.simulation.grouped
    data = grouping.pack(clients, self.simulation.group_size) if grouped else clients
    sizes = [len(d["sizes"]) for d in data] if grouped else [1] * len(clients)
    context = self.client_context(state) if self.parts.context_type is not None else None
    out = dict(self.run_round(
        weights=common.flat_weights(state.weights),
        seed=common.round_seed(self.config.seed, state.round_num), data=data,
        aggregator_states=collections.OrderedDict(update=state.aggregator_state),
        **self.parts.arguments(client_states, context, client_ids, sizes)))
    out["aggregator_state"] = out.pop("aggregator_states")["update"]
    if self._flat_upload:
      out["update"] = common.unflatten(np.asarray(out["update"][0]), self.trained_specs)
    if self.parts.reports:
      out["reports"] = self.parts.reports_of(out["reports"])
    if self.parts.stateful:
      out["client_states"] = self.parts.client_states(out["client_states"], sizes)
    return out

  def next(self, state: server_step.ServerState, clients: list[dict], *,
           client_ids: Sequence[int] | None = None,
           store: client_state_lib.ClientStateStore | None = None):
    """One round: (new server state, metrics). A stateful process reads the sampled clients'
    states (`client_ids`, in the order of `clients`) from `store` and writes their new ones."""
    states = None
    if self.client_state is not None:
      if store is None or client_ids is None or len(client_ids) != len(clients):
        raise ValueError("this process keeps client state: next() needs the clients' ids (one per "
                         "client) and a client_state.ClientStateStore")
      states = store.read(client_ids, state.round_num, self._initial_client_state)
    out = self.compute_update(state, clients, states, client_ids)
    update, method_state, extra_metrics = server_stage_lib.before_optimizer(
        self.stages, state.method_state, state.round_num, out)
    new_state, metrics = self.finish_round(state, update, out["loss"], len(clients),
                                           out["aggregator_state"], method_state)
    new_state.weights = server_stage_lib.after_optimizer(
        self.stages, state.method_state, state.round_num, state.weights, new_state.weights)
    if states is not None:
      store.write(client_ids, out["client_states"], state.round_num)
    # The aggregator's measurements, the reporting terms' (`ClientTerm.measurements`), the server
    # stage's.
    extra = [item for t in client_work.reporting_terms(self.config, self.model)
             for item in t.measurements(out["reports"][t.key]).items()]
    extra += list(extra_metrics.items())
    if states is not None:
      extra += list(self.client_state.measurements(out["client_states"]).items())
    extra += list(client_work.schedule_measurements(self.config, state.round_num).items())
    metrics["aggregation"] = out["measurements"]
    if isinstance(self.factory, aggregators.PrivateFactory):
      metrics["dp_events"] = self.factory.dp_events(out["aggregator_state"])
    if extra:
      metrics["aggregation"] = collections.OrderedDict(
          list(dict(out["measurements"]).items()) + extra)
    return new_state, metrics

  def initial_method_state(self):
    return server_stage_lib.initial_state(self.stages)

  def local_step_parts(self, stage: int):
    """(Model, trained-tensor mask, client config, whether the clients download the frozen tensors
    each round) of a local step: the whole model in every stage (`bin/benchmark --layerwise`)."""
    del stage
    return self.model, self.mask, self.config, True

  def client_context(self, state: server_step.ServerState):
    """What the server broadcasts to the round's clients beside the weights (the client state's
    `context_spec`): each server stage's context, from its part of `state.method_state`."""
    return server_stage_lib.context(self.stages, state.method_state, state.round_num,
                                    self.client_state.context_spec(self.model))


# Fields FedAvg-style methods read beyond every federated method's (DCCO's update aggregation is its
# N_k-weighted mean, and its clients take full-batch steps).
