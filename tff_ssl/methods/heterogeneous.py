"""Clients of different architectures (FedFoA's heterogeneous setting, `--method=heterogeneous`): client
c trains its own model, with encoder `architectures[c % A]`; no weights are averaged and none leave a
client. Without `--fedfoa` every client trains alone (the paper's "BYOL" row of its Tables 1-2); with
`--fedfoa` the clients exchange only their feature-correlation matrices R through the server's bank
(`tff_ssl.methods.fedfoa`) and add FedFoA's alignment term to their SSL loss.

    round r, for each architecture a: one federated computation (`round_of[a]`)
      SERVER   seed, the bank ──broadcast──►  CLIENTS of architecture a, each with its own state
                                              (online network, BYOL target, rounds taken)
                                              local training from its own online network
                                              (`client_work.local_training`: the SSL loss + FedFoA's term)
      SERVER   ◄──collect── (id, R_bar)       the new state stays at the client
    server: the bank takes every group's reports (in the round's sampling order)

So each computation's type signature has nothing weight-shaped at the SERVER: in, the seed and the
bank; out, the mean loss, the example count and the reports (`tests/methods/test_fedfoa.py`).

Calibration. The paper gives every architecture "one linear calibration layer at the tail part" into
the shared projection dimension (its Fig. 3: "the linear projector calibrates the features of
heterogeneous network into one identical projection dimension"). Here every client's SSL model is
encoder -> projector (-> predictor), and the projector's last layer is linear into `projector[-1]`,
the shared dimension n in which the SSL loss and FedFoA's Z live; with `--projector=n` (the FedFoA
table's rows) the projector is exactly that one linear layer.

Evaluation. A run probes clients 0 .. A-1, one of each architecture, and reports their mean (the
paper's "Avg."); with every client in every round and one client per architecture (the paper's four)
these are all the clients. Each architecture's initialization is drawn from (seed, its position).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import models
from tff_ssl.federated import client_state as client_state_lib
from tff_ssl.federated import masks
from tff_ssl.federated import server_step
from tff_ssl.federated import client_work, common, composer, grouping, round_parts, server_stage, ssl_model
from tff_ssl.methods import addons, fedavg
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.config_fields import Field
from tff_ssl.method import FEDERATED_FIELDS, Method

INIT_KEY = 0x4E7  # Folded with the seed and an architecture's position: its initialization.


class OwnModelState(client_state_lib.ClientState):
  """A client that trains only its own model: `rounds` taken, `online` (all the model's tensors),
  and `target` (BYOL's EMA target network, for SSL methods with one). A new client starts from its
  architecture's initialization, its target equal to it."""

  def __init__(self, ema_target: bool):
    self.ema_target = ema_target

  def spec(self, model):
    out = collections.OrderedDict(rounds=tf.TensorSpec([], tf.float32),
                                  online=list(model.weight_specs))
    if self.ema_target:
      out["target"] = list(model.weight_specs)
    return out

  def initial(self, model):
    out = collections.OrderedDict(rounds=np.float32(0.0),
                                  online=[w.copy() for w in model.initial_weights])
    if self.ema_target:
      out["target"] = [w.copy() for w in model.initial_weights]
    return out

  def begin(self, state, weights, context=None):
    del weights, context  # Nothing is broadcast: the client starts from its own network.
    return list(state["online"])

  def ssl_state(self, state, start, context=None, client_id=None):
    del start, context, client_id
    return {"target": list(state["target"])} if self.ema_target else None

  def end(self, state, weights, delta, num_examples, loss, ssl_state=None, context=None):
    del num_examples, loss, context
    out = collections.OrderedDict(rounds=state["rounds"] + 1.0,
                                  online=[w - d for w, d in zip(weights, delta)])
    if self.ema_target:
      out["target"] = list(ssl_state["target"])
    return out


class HeterogeneousProcess:
  """One federated computation per architecture, one bank (module docstring): a
  `process.FederatedProcess` whose clients keep their own models, so `encoders` reads them from the
  store. The server state has no weights: `ServerState.weights` is empty and the method state is
  FedFoA's bank (or nothing)."""

  keeps_client_state = True
  needs_auxiliary = False

  def __init__(self, models: Sequence[FunctionalModel], labels: Sequence[str], image_shape,
               config: ClientConfig, simulation: grouping.Simulation = grouping.Simulation(),
               stages: Sequence[server_stage.ServerStage] = ()):
    if len(models) != len(labels) or not models:
      raise ValueError("a heterogeneous process needs one label per model, and a model")
    self.models, self.labels = list(models), list(labels)
    for m in self.models:
      masks.TensorMask.require_all(m, "heterogeneous FedFoA")
    dims = {m.output_dims[0] for m in self.models}
    if len(dims) != 1:
      raise ValueError(f"the architectures' projections must share one dimension (the calibration); "
                       f"got {sorted(dims)}")
    self.dim = dims.pop()
    # FedFoA's server stage (its bank), where the clients align their features.
    self.stages = tuple(stages)  # The add-ons' (FedFoA's bank, where the clients align features).
    self.simulation = simulation
    self.states = []
    self.round_of, self.parts_of = [], []
    for model in self.models:  # Each architecture's clients: their own model, wrapped by the stages.
      state, self.config, factory = server_stage.fold(
          self.stages, model, OwnModelState(config.method.ema_target), config, None)
      if factory is not None:
        raise ValueError("heterogeneous clients send no one model to aggregate; a server stage "
                         "that chooses the aggregation has nothing to aggregate")
      self.states.append(state)
      run_round, parts = self._build_round(model, state, image_shape)
      self.round_of.append(run_round)
      self.parts_of.append(parts)
    self.client_state = self.states[0]  # A stateful process: the runner gives it a store.

  def _build_round(self, model: FunctionalModel, state_lib, image_shape):
    cfg, grouped = self.config, self.simulation.grouped
    parts = round_parts.RoundParts(state_lib, cfg, model, grouped)
    data_type = (grouping.group_input_type(image_shape) if grouped
                 else common.client_input_type(image_shape))

    @tff.tensorflow.computation(common.SEED_TYPE, data_type, parts.client_type)
    def client_update(seed, data, extra):
      states, context, ids = parts.unpack(extra)
      if grouped:
        def body(images, ids_k, state, client_id, acc):
          _, first, _, n, new, report = client_work.client_round(
              model, cfg, state_lib, None, seed, {"images": images, "ids": ids_k}, state, context,
              client_id)
          return (acc[0] + n * first, acc[1] + n), new, report

        (loss_sum, n), outputs = parts.fold(data, body, (tf.constant(0.0), tf.constant(0.0)),
                                            states, ids)
        return (loss_sum / n, n) + outputs  # + (new states,) + (reports,) where reporting
      _, first, _, n, new, report = client_work.client_round(model, cfg, state_lib, None, seed,
                                                             data, states, context, ids)
      if not parts.reports:
        return first, n, new
      # The report as a one-client stack, as a grouped slot's.
      return first, n, new, tf.nest.map_structure(lambda x: x[None], report)

    def results(aggregated, out, names):
      del names
      result = collections.OrderedDict(loss=aggregated.result, examples=tff.federated_sum(out[1]),
                                       client_states=out[2])  # Stay at the clients.
      if parts.reports:  # Uploaded: each client's (id, R_bar), at the server.
        result["reports"] = parts.collect_reports(out[3])
      return result

    # No global model: the round's one aggregate is the clients' mean loss.
    outputs = ("loss", "examples", "client_states") + (("reports",) if parts.reports else ())
    arguments = tff.structure.iter_elements(parts.parameter([
        ("seed", tff.FederatedType(common.SEED_TYPE, tff.SERVER)),
        ("data", tff.FederatedType(data_type, tff.CLIENTS))]))
    run_round = composer.Round(
        list(arguments), [composer.Phase("train", client_update, ("seed", "data", "extra"),
                                         composer.Mean(), outputs, results)],
        outputs, derived=[("extra", parts.at_clients)]).computation()
    return run_round, parts

  def architecture_of(self, client_id: int) -> int:
    return int(client_id) % len(self.models)

  def initialize(self) -> server_step.ServerState:
    return server_step.ServerState(
        weights=[], optimizer_state=(), aggregator_state=(), round_num=0,
        method_state=server_stage.initial_state(self.stages))

  def next(self, state: server_step.ServerState, clients: list[dict], *,
           client_ids: Sequence[int] | None = None,
           store: client_state_lib.ClientStateStore | None = None):
    """One round: each architecture's clients train (one computation per architecture); returns
    (new server state, metrics)."""
    if store is None or client_ids is None or len(client_ids) != len(clients):
      raise ValueError("heterogeneous clients keep their models: next() needs the clients' ids "
                       "(one per client) and a client_state.ClientStateStore")
    if not clients:
      raise ValueError("a round needs at least one client")
    seed = common.round_seed(self.config.seed, state.round_num)
    ids_out, states_out, reports, measurements = [], [], [], collections.OrderedDict()
    loss_sum = examples = 0.0
    for a, (model, run_round) in enumerate(zip(self.models, self.round_of)):
      picked = [k for k, c in enumerate(client_ids) if self.architecture_of(c) == a]
      if not picked:
        continue
      ids = [int(client_ids[k]) for k in picked]
      group = [clients[k] for k in picked]
      states = store.read(ids, state.round_num, self.states[a].initial(model))
      parts = self.parts_of[a]
      if self.simulation.grouped:
        data = grouping.pack(group, self.simulation.group_size)
        sizes = [len(d["sizes"]) for d in data]
      else:
        data, sizes = group, [1] * len(group)
      spec = self.states[a].context_spec(model)
      context = (server_stage.context(self.stages, state.method_state, state.round_num, spec)
                 if spec else None)
      out = run_round(seed=seed, data=data, **parts.arguments(states, context, ids, sizes))
      states_out.extend(parts.client_states(out["client_states"], sizes))
      ids_out.extend(ids)
      loss, n = float(out["loss"]), float(out["examples"])
      measurements[f"loss_{self.labels[a]}"] = np.float32(loss)
      loss_sum, examples = loss_sum + loss * n, examples + n
      if parts.reports:
        reports.append(parts.reports_of(out["reports"]))
    store.write(ids_out, states_out, state.round_num)
    merged = None
    if reports:
      merged = tf.nest.map_structure(lambda *xs: np.concatenate(xs), *reports)
      order = np.argsort([list(client_ids).index(int(c)) for c in merged["client"]], kind="stable")
      merged = tf.nest.map_structure(lambda v: v[order], merged)  # The round's sampling order.
    # The server stages (FedFoA's bank) on the round's reports; there is no global model to update.
    _, method_state, measured = server_stage.before_optimizer(
        self.stages, state.method_state, state.round_num, {"update": [], "reports": merged})
    measurements.update(measured)
    method_state = state.method_state if method_state is None else method_state
    new_state = server_step.ServerState(weights=[], optimizer_state=(), aggregator_state=(),
                                   round_num=state.round_num + 1, method_state=method_state)
    return new_state, {"loss": loss_sum / examples, "clients": len(clients),
                       "aggregation": measurements}

  def encoders(self, state: server_step.ServerState | None,
               store: client_state_lib.ClientStateStore | None) -> list[tuple[str, tf.keras.Model]]:
    """(label, Keras encoder) of clients 0 .. A-1, one of each architecture, after the rounds of
    `state`; with `state` None, the architectures' initializations (the random-init baseline)."""
    if state is not None and store is None:
      raise ValueError("a heterogeneous run has one encoder per architecture, in its clients' "
                       "states; its results.json holds each one's accuracy")
    out = []
    for a, (model, label) in enumerate(zip(self.models, self.labels)):
      if state is None:
        weights = model.initial_weights
      else:
        weights = store.read([a], state.round_num, self.states[a].initial(model))[0]["online"]
      out.append((label, ssl_model.keras_encoder(model, [np.asarray(w) for w in weights])))
    return out


def models_of(config, image_shape) -> list[FunctionalModel]:
  """One SSL model per architecture of `config.architectures`, each initialized from (seed, its
  position); `stem_stride` and `pool_grid` apply to the ResNets."""
  out = []
  for a, encoder in enumerate(config.architectures):
    tf.keras.utils.set_random_seed(int(np.random.default_rng([config.seed, INIT_KEY, a])
                                       .integers(2**31)))
    resnet = encoder in models.RESNETS
    out.append(FunctionalModel(ssl_model.ssl_model_builder(dataclasses.replace(
        config, encoder=encoder, stem_stride=config.stem_stride if resnet else 1,
        pool_grid=config.pool_grid if resnet else 1), image_shape)))
  return out


def build(config, model, image_shape, context=None) -> HeterogeneousProcess:
  del model, context  # The process builds one model per architecture; no server training.
  fedavg_config, _, simulation, stages = config.parsed
  return HeterogeneousProcess(models_of(config, image_shape), list(config.architectures),
                              image_shape, fedavg_config, simulation,
                              stages.of(None, None))  # --fedfoa's bank.


def _validate(config):
  parsed = fedavg.process_config(config)  # With the add-ons' rules (FedFoA's).
  if not config.architectures:
    raise ValueError("architectures must name at least one encoder")
  if len(config.architectures) > config.num_clients:
    raise ValueError(f"{len(config.architectures)} architectures need at least as many clients; got "
                     f"num_clients={config.num_clients}")
  return parsed


ARCHITECTURES = Field("architectures", ("resnet14", "resnet18", "vgg9", "alexnet"),
                      "Heterogeneous clients: client c's encoder is the (c mod count)-th of these, "
                      "e.g. resnet14,resnet18,vgg9,alexnet.", item=str,
                      choices=lambda: models.ENCODERS)
FIELDS = tuple(f for f in FEDERATED_FIELDS if not f.startswith("server_")) + (
    ARCHITECTURES, client_work.LOCAL_BATCH_SIZE, client_work.LOCAL_UNIT,
    client_work.CLIENT_WEIGHT_DECAY) + addons.CLIENT_STATE_FIELDS  # --fedfoa

METHOD = Method(
    name="heterogeneous", kind="federated", fields=FIELDS, ssl=("byol", "simsiam", "simclr"),
    validate=_validate, build=build,
    no_privacy=("its clients of different architectures send models of different shapes (or, "
                "with --fedfoa, feature-correlation matrices), not one update a clipped sum "
                "bounds"),
    min_samples=fedavg.METHOD.min_samples,
    divergence_hint=lambda config: f"lower --client_learning_rate (now "
                                   f"{config.client_learning_rate})",
    summary="Clients of different architectures (--architectures), each its own model; with "
            "--fedfoa they exchange only feature-correlation matrices.")
