"""FedAvg-style federated SSL (`--method=fedavg`): any client SSL method (`tff_ssl.ssl`) with any
aggregation strategy (`tff_ssl.aggregators`) and the add-ons (`--fedfoa`, `--fedx`, `--fedu2_*`). The
round is `tff_ssl.federated.fedavg_process.FedAvgSSLProcess`, which every FedAvg-style method hosts;
this module declares the method: its fields, its typed configs (`process_config`) and its build.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from tff_ssl import aggregators, privacy
from tff_ssl import data as data_lib
from tff_ssl import ssl as ssl_lib
from tff_ssl.federated import client_work, grouping, local_steps, masks, server_step
from tff_ssl.federated.client_work import ClientConfig
from tff_ssl.federated.fedavg_process import FedAvgSSLProcess
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.federated.process import BuildContext
from tff_ssl.method import FEDERATED_FIELDS, Method
from tff_ssl.methods import addons

FIELDS = FEDERATED_FIELDS + aggregators.FIELDS + privacy.FIELDS + (client_work.LOCAL_BATCH_SIZE,
                                                  client_work.LOCAL_UNIT,
                                                  client_work.CLIENT_WEIGHT_DECAY,
                                                  local_steps.CLIENT_LR_SCHEDULE, "warmup_fraction") + addons.FIELDS
# What a host whose clients keep no state reads (FedAvg itself, FedProx, the layer-wise methods).
STATELESS_FIELDS = tuple(f for f in FIELDS if f not in addons.CLIENT_STATE_FIELDS)


class Parts(NamedTuple):
  """The typed configs of a FedAvg-style run (`process_config`): what its build reads."""

  client: ClientConfig
  aggregator: aggregators.AggregatorConfig
  simulation: grouping.Simulation
  stages: addons.Stages  # The add-ons' server stages (`stages.of(model, mask)`).


def process_config(config) -> Parts:
  """The FedAvg process's typed configs of an `ExperimentConfig` (building them validates them)."""
  addons.validate(config)
  private = privacy.from_config(config)
  privacy.check_simulation(private, config.simulation)
  aggregator = aggregators.AggregatorConfig(
      name=config.aggregator, granularity=config.aggregator_granularity,
      scale_normalization=config.scale_normalization,
      fedavg_warmup_rounds=config.fedavg_warmup_rounds,
      measure_divergence=config.measure_divergence, privacy=private,
      equal_clients=data_lib.PARTITIONS[config.partition].fixed_size)
  aggregator.check_options()
  client = ClientConfig(
      ssl=config.ssl, hparams=ssl_lib.hparams_of(config),
      client_optimizer=config.client_optimizer,
      client_learning_rate=config.client_learning_rate,
      client_weight_decay=config.client_weight_decay, local_steps=config.local_steps,
      local_batch_size=config.local_batch_size, local_unit=config.local_unit, augment=config.augment_config(), seed=config.seed,
      head_norm=config.head_norm, lr_schedule=config.client_lr_schedule,
      warmup_fraction=config.warmup_fraction, rounds=config.rounds,
      view_pairs=privacy.view_pairs(config, private)).with_terms(
          *addons.terms(config))  # The client add-ons the config turns on (--fedx).
  return Parts(client, aggregator,
               grouping.Simulation(mode=config.simulation, group_size=config.group_size),
               addons.stages(config))


def build(config, model: FunctionalModel, image_shape: Sequence[int],
          context: BuildContext = BuildContext()) -> FedAvgSSLProcess:
  del context  # The server trains on nothing of its own; one aggregation a round.
  fedavg_config, aggregator, simulation, stages = config.parsed
  mask = masks.TensorMask.of_model(model)  # Every tensor but the frozen ones.
  return FedAvgSSLProcess(model, image_shape, server_step.server_optimizer_for(config, model.names),
                          fedavg_config, aggregator.build(model, mask), simulation, mask=mask,
                          stages=stages.of(model, mask))


def divergence_hint(config) -> str:
  """What to try when a FedAvg-style run's loss became NaN or infinite."""
  hint = f"lower --server_learning_rate (now {config.server_learning_rate})"
  divergence_aware = aggregators.AGGREGATORS[config.aggregator].divergence_aware
  if divergence_aware and not config.fedavg_warmup_rounds:
    # Scaling scale-invariant (weight-standardized) layers by cosines < 1 shrinks them round after
    # round, which raises the clients' effective step size (docs/results.md: the mini L-DAWA table).
    hint = (f"{config.aggregator} shrinks layers whose cosine to the global model is low: start "
            f"with FedAvg rounds (--fedavg_warmup_rounds=2, the authors' code) or {hint}")
  return hint


METHOD = Method(
    name="fedavg", kind="federated", fields=STATELESS_FIELDS, ssl=tuple(ssl_lib.SSL_METHODS),
    validate=process_config, build=build,
    min_samples=lambda config: addons.min_samples(config, ssl_lib.get(config.ssl).min_samples),
    divergence_hint=divergence_hint,
    summary="FedAvg with a within-client SSL loss (--ssl) and any aggregation strategy "
            "(--aggregator).")
