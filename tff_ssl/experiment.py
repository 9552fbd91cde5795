"""One experiment end to end: load data, pretrain, evaluate, write the run folder.

`ExperimentConfig` is the frozen, validated description of a run; `tasks/` names configs and
`bin/train` overrides their fields from flags. `run(config, output_dir)` writes into `output_dir`:

  hparams.json   the config, written first
  metrics.csv    step (or round), loss, the periodic linear probe where one ran (`tff.program`
                 release managers, `observers.MetricSinks` / `StepSinks`)
  checkpoints/   tff.program state: the final encoder (centralized), the server state (federated)
  tensorboard/   the same metrics
  resources.csv  federated runs: wall time and resident memory per round (machine-dependent)
  results.json   linear-probe accuracy of the pretrained encoder and of the same encoder at random
                 initialization; written last and atomically, so its presence marks a finished run.

Methods: the registry `tff_ssl.methods` (federated TFF processes, centralized pretraining, the
supervised baseline), each training with an SSL method of `tff_ssl.ssl` (`ssl`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import shutil
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from tff_ssl import config_fields
from tff_ssl import data as data_lib
from tff_ssl import evaluation, methods, models, optim, rundir
from tff_ssl import progress as progress_lib
from tff_ssl import ssl as ssl_lib
from tff_ssl import observers, runner
from tff_ssl.config_fields import Field
from tff_ssl.data.augment import BLUR, CROP_MIN_SCALE
from tff_ssl import privacy as privacy_lib
from tff_ssl.federated import functional, grouping, sampling, ssl_model
from tff_ssl.federated import local_steps
from tff_ssl.federated import server_step
from tff_ssl.training import PretrainConfig, centralized, pretrain
from tff_ssl.methods import addons


def method_specific_fields() -> tuple[str, ...]:
  """Fields some methods (`tff_ssl.methods`) or SSL methods (`tff_ssl.ssl`) read and others not."""
  return tuple(sorted({f for m in methods.METHODS.values() for f in m.field_names} | {"ssl"} |
                      {f for m in ssl_lib.SSL_METHODS.values() for f in m.hparams}))


# Partitions of the training split into clients, and the fields each reads (`data.PARTITIONS`).
PARTITIONS = {name: p.fields for name, p in data_lib.PARTITIONS.items()}


# The fields every run has, each declared by its owner (the data sources, partitions, augmentation,
# models, heads, SSL losses, sampling, the client and server steps, evaluation, the observers, the
# runner); the methods declare their own (`Method.fields`). Only what names a run is declared here.
SHARED_FIELDS = (
    Field("method", "centralized", "Method (tff_ssl.methods): " + "; ".join(
        f"{m.name}: {m.summary}" for m in methods.METHODS.values()), choices=lambda: methods.METHODS),
    Field("ssl", "cco", "SSL method (tff_ssl.ssl) the method trains with: " + ", ".join(
        f"{m.name} ({'/'.join(m.ssl)})" for m in methods.METHODS.values() if m.ssl) + ".",
          choices=lambda: ssl_lib.SSL_METHODS),
    data_lib.sources.DATASET, data_lib.sources.DATA_DIR, data_lib.sources.DOWNLOAD,
    data_lib.sources.PROBE_DATASET,
    models.ENCODER, models.WIDTH, models.resnet.STEM_STRIDE, models.resnet.POOL_GRID,
    models.resnet.WEIGHT_STANDARDIZATION, models.vit.DEPTH, models.vit.PATCH_SIZE,
    models.vit.READOUT, models.vit.FREEZE_PATCH_EMBED, models.layers.PRECISION,
    ssl_model.PROJECTOR, ssl_model.PREDICTOR, ssl_model.HEAD_NORM, ssl_model.PROJECTOR_OUTPUT,
    *ssl_lib.HPARAMS.values(),
    centralized.STEPS, centralized.BATCH_SIZE, centralized.OPTIMIZER, centralized.LEARNING_RATE,
    centralized.WEIGHT_DECAY, optim.WARMUP_FRACTION,
    CROP_MIN_SCALE, BLUR,  # tff_ssl/data/augment.py's (the package's `augment` is a function).
    # Federated methods.
    runner.ROUNDS, data_lib.partition.NUM_CLIENTS, data_lib.partition.PARTITION,
    data_lib.partition.SAMPLES_PER_CLIENT, data_lib.partition.SPLIT_SAMPLES,
    data_lib.partition.ALPHA, data_lib.partition.CLASSES_PER_CLIENT,
    sampling.CLIENTS_PER_ROUND, sampling.CLIENT_SAMPLING,
    local_steps.LOCAL_STEPS, local_steps.CLIENT_OPTIMIZER, local_steps.CLIENT_LEARNING_RATE,
    server_step.SERVER_OPTIMIZER, server_step.SERVER_LEARNING_RATE, server_step.SERVER_LR_SCHEDULE,
    observers.EVAL_EVERY, observers.KNN_EVERY, observers.MEASURE_WEIGHT_NORMS,
    observers.CHECKPOINT_EVERY, grouping.SIMULATION, grouping.GROUP_SIZE,
    evaluation.protocols.VALIDATION_FRACTION, evaluation.protocols.EVAL_LABEL_FRACTION,
    evaluation.protocols.EVAL_STEPS, evaluation.protocols.EVAL_LEARNING_RATE, observers.LOG_EVERY,
    Field("seed", 0, "Seed of every random choice.", lower=0),
    observers.EMA_EVAL, runner.INIT_FROM,
)


class _ExperimentConfig:
  """A pretraining + evaluation run; defaults are the README demo's.

  A frozen dataclass assembled from `SHARED_FIELDS` and the fields the registered methods declare
  (`Method.fields`): `config_fields.specs(ExperimentConfig)` lists every field with its help,
  bounds and choices; bin/train makes one flag of each.
  """

  def __post_init__(self):
    # The method's registry entry, resolved once: the run layer reads it as `method_entry`.
    object.__setattr__(self, "_method_entry", methods.get(self.method))
    # Each field's own rule (bounds, choices, finite numbers), from its declaration.
    for spec in config_fields.specs(type(self)):
      value = spec.normalize(getattr(self, spec.name))
      object.__setattr__(self, spec.name, value)
      spec.check(value)
    # Rules between fields.
    vit = self.encoder in models.VITS
    if not vit and (self.depth or self.patch_size or self.readout != "cls" or
                    self.freeze_patch_embed):
      raise ValueError(f"depth, patch_size, readout and freeze_patch_embed are ViT options; encoder "
                       f"{self.encoder!r} is not a ViT (use --encoder=vit_tiny or vit_mini, or drop "
                       f"them)")
    if self.encoder not in models.RESNETS and self.stem_stride != 1:
      raise ValueError(f"stem_stride is a ResNet option; encoder {self.encoder!r} is not a ResNet "
                       f"(drop --stem_stride)")
    if self.encoder not in models.RESNETS and not self.weight_standardization:
      raise ValueError(f"weight_standardization is a ResNet option; encoder {self.encoder!r} is not "
                       f"a ResNet (drop --noweight_standardization)")
    if vit and self.precision != "float32":
      raise ValueError(f"--precision={self.precision} covers convolutions and dense layers of "
                       f"vectors; the ViT {self.encoder!r} would still attend in float32 (use "
                       f"--precision=float32, or a ResNet encoder)")
    if self.encoder not in models.RESNETS and self.pool_grid != 1:
      raise ValueError(f"pool_grid is a ResNet option; encoder {self.encoder!r} is not a ResNet "
                       f"(drop --pool_grid)")
    if self.clients_per_round > self.num_clients:
      raise ValueError(f"clients_per_round ({self.clients_per_round}) exceeds num_clients "
                       f"({self.num_clients})")
    if not self.projector:
      raise ValueError("projector needs at least one layer size, e.g. 512,512,512")
    if self.predictor and self.predictor[-1] != self.projector[-1]:
      raise ValueError(f"predictor sizes must end at the projector's output "
                       f"{self.projector[-1]}; got {list(self.predictor)}")
    data_lib.PARTITIONS[self.partition].check(self)
    if self.probe_dataset and self.method_entry.kind != "centralized":
      raise ValueError(f"--probe_dataset={self.probe_dataset} probes a centralized pretraining on "
                       f"other images; method {self.method!r} is {self.method_entry.kind} and "
                       f"probes --dataset: remove --probe_dataset (or train with --dataset="
                       f"{self.probe_dataset})")
    if self.probe_dataset and (data_lib.image_shape(self.probe_dataset) !=
                               data_lib.image_shape(self.dataset)):
      raise ValueError(f"--probe_dataset={self.probe_dataset} has images of shape "
                       f"{data_lib.image_shape(self.probe_dataset)}; --dataset={self.dataset}'s are "
                       f"{data_lib.image_shape(self.dataset)}: choose a probe dataset of that shape")
    if self.method_entry.kind == "federated":
      sampling.check(self.client_sampling, self.num_clients, self.clients_per_round, self.rounds)
    else:
      for name, what in (("init_from", "starts a federated run from another run's encoder"),
                         ("ema_eval", "averages a federated run's server weights")):
        if getattr(self, name):
          raise ValueError(f"--{name} {what}; method {self.method!r} is "
                           f"{self.method_entry.kind}: remove --{name}")
    if self.head_norm == "batch":
      refusal = self.method_entry.no_batch_heads
      if refusal:
        raise ValueError(f"--head_norm=batch: {refusal}; use --head_norm=group")
      if self.local_batch_size == 1:
        raise ValueError("--head_norm=batch needs >= 2 images in a client's batch for its "
                         "statistics; got local_batch_size=1 (raise it, or use --head_norm=group)")
    # The method's own rules, where its typed sub-configs are built (once) and kept for its build.
    object.__setattr__(self, "_parsed", self.method_entry.check(self))

  @property
  def method_entry(self) -> methods.Method:
    """The registry entry of `method` (`tff_ssl.methods`), resolved when the config was made."""
    return self._method_entry

  @property
  def parsed(self) -> Any:
    """The method's typed sub-configs, as its `validate` returned them when the config was made:
    what its `build` reads (the config is parsed once)."""
    return self._parsed

  @property
  def predictor_sizes(self) -> tuple[int, ...]:
    return self.predictor or (512, self.projector[-1])

  @property
  def has_predictor(self) -> bool:
    """Whether the SSL model ends in a predictor head: its SSL method's, or one a client add-on's
    terms read (`tff_ssl.methods.addons`: FedX with SimCLR)."""
    return ssl_lib.get(self.ssl).predictor or addons.predictor(self)

  def check_fields_for_method(self, fields_set: set[str] | list[str]) -> None:
    """Raises ValueError if a field in `fields_set` is one `self.method` (with `self.ssl`) does not
    read, or if a DP run states no noise (`privacy.check_noise_stated`)."""
    method = self.method_entry
    # The predictor's sizes are read wherever the model has one: its SSL method's, or the one a
    # client add-on gives it (FedX on SimCLR).
    own = method.reads(self) + (("predictor",) if self.has_predictor else ())
    stray = sorted(f for f in fields_set if f in method_specific_fields() and f not in own)
    if stray and method.no_privacy and stray[0] in privacy_lib.FIELD_NAMES:
      raise ValueError(f"--{stray[0]} is refused by method {self.method!r}: {method.no_privacy}")
    if stray:
      readers = ([m for m, spec in methods.METHODS.items() if stray[0] in spec.field_names] +
                 [f"--ssl={s}" for s, spec in ssl_lib.SSL_METHODS.items()
                  if stray[0] in spec.hparams])
      using = f"method {self.method!r}" + (f" with --ssl={self.ssl}" if method.ssl else "")
      raise ValueError(f"--{stray[0]} is not used by {using}; remove it (it is read by "
                       f"{readers or 'methods that train with an SSL loss'})")
    own = PARTITIONS[self.partition]
    stray = sorted(f for f in fields_set
                   if f not in own and any(f in fields for fields in PARTITIONS.values()))
    if stray:
      readers = [p for p, fields in PARTITIONS.items() if stray[0] in fields]
      raise ValueError(f"--{stray[0]} is not used by partition {self.partition!r}; remove it (it "
                       f"is read by partition {' and '.join(repr(p) for p in readers)})")
    privacy_lib.check_noise_stated(self, fields_set)

  def build_encoder(self, image_shape, name: str | None = None) -> tf.keras.Model:
    """A freshly initialized encoder of this config for images of `image_shape` (H, W, C), as a
    Keras model named `name` (default: the encoder's own name), multiplying in `precision`."""
    with models.layers.precision(self.precision):
      return self._build_encoder(image_shape, name)

  def _build_encoder(self, image_shape, name: str | None = None) -> tf.keras.Model:
    return models.build_encoder(self.encoder, image_shape, width=self.width,
                                small_input=image_shape[0] <= 64, stem_stride=self.stem_stride,
                                **({"pool_grid": self.pool_grid} if self.pool_grid != 1 else {}),
                                **({} if self.weight_standardization else
                                   {"weight_standardization": False}),
                                depth=self.depth, patch_size=self.patch_size, name=name,
                                **({"readout": self.readout,
                                    "freeze_patch_embed": self.freeze_patch_embed}
                                   if self.encoder in models.VITS else {}))

  def augment_config(self) -> data_lib.AugmentConfig:
    return data_lib.AugmentConfig(crop_scale=(self.crop_min_scale, 1.0), blur=self.blur)

  def pretrain_config(self) -> PretrainConfig:
    """Centralized pretraining's typed config (its `parsed`, made when the config was)."""
    if self.method_entry.kind != "centralized":
      raise ValueError(f"method {self.method!r} does not pretrain centrally")
    return self.parsed

  def knn_config(self) -> evaluation.KNNConfig:
    return evaluation.KNNConfig(seed=self.seed)

  def probe_config(self) -> evaluation.LinearProbeConfig:
    return evaluation.LinearProbeConfig(label_fraction=self.eval_label_fraction,
                                        steps=self.eval_steps,
                                        learning_rate=self.eval_learning_rate, seed=self.seed)


def config_class(entries) -> type:
  """The config dataclass of the shared fields and the fields the methods `entries` declare (in
  their order; a field shared by several methods once)."""
  return config_fields.make_config_class(
      "ExperimentConfig", config_fields.collect([SHARED_FIELDS] + [m.declared for m in entries]),
      _ExperimentConfig, __name__)


# The config: the shared fields, then each registered method's own, in registry order. Assembled
# once, here: a method's own fields need its line in `tff_ssl/methods/__init__.py`.
ExperimentConfig = config_class(methods.METHODS.values())
methods.config_assembled(f.name for f in dataclasses.fields(ExperimentConfig))


class RunExistsError(ValueError):
  """The output folder already holds a finished run."""


def probe_config_of(config: ExperimentConfig) -> ExperimentConfig:
  """`config` with the dataset its probes read (`--probe_dataset`, else its own)."""
  if config.probe_dataset and config.probe_dataset != config.dataset:
    return dataclasses.replace(config, dataset=config.probe_dataset, probe_dataset="")
  return config


def load_splits(config: ExperimentConfig) -> tuple[data_lib.ImageSet, data_lib.ImageSet]:
  """The (train, evaluation) splits of a run: (train, test), or with `validation_fraction` > 0,
  (train minus a stratified held-out fraction, that held-out validation split)."""
  train = data_lib.load(config.dataset, "train", data_dir=config.data_dir, download=config.download)
  if not config.validation_fraction:
    return train, data_lib.load(config.dataset, "test", data_dir=config.data_dir,
                                download=config.download)
  held = evaluation.labeled_subset(train.labels, config.validation_fraction, config.seed + 1)
  rest = np.setdiff1d(np.arange(len(train)), held)
  return train.subset(rest), train.subset(held)


Evaluate = Callable[[tf.keras.Model, data_lib.ImageSet, data_lib.ImageSet], dict[str, Any]]


def run(config: ExperimentConfig, output_dir: str, *, progress: bool = True,
        random_init_baseline: bool = True, evaluate: Evaluate | None = None) -> dict[str, Any]:
  """Pretrains and evaluates per `config`, writing the run folder `output_dir`; returns the results.

  All input is checked (data present, sizes feasible, folder not holding a finished run) before the
  folder is created. `random_init_baseline`: also probe the encoder at its initialization, and a
  linear classifier on the raw pixels under the same probe (the baselines a pretrained encoder's
  number means something beside; last, so the other numbers are those of a run without them)
  `evaluate(encoder, train, test)`: further evaluations of the pretrained encoder, stored under
  "evaluations" in results.json (which is written last, so a run interrupted while evaluating resumes).
  """
  results_path = os.path.join(output_dir, "results.json")
  if os.path.exists(results_path):
    raise RunExistsError(f"{output_dir} already holds a finished run (results.json); choose another "
                         f"--output_dir or delete it")
  rundir.check_creatable(output_dir)
  with rundir.session():  # The folder's lock (taken when it is created) is released on return.
    if os.path.isdir(output_dir):
      rundir.lock(output_dir)  # Refuse at once if another run is writing it.
    return _run(config, output_dir, results_path, progress=progress,
                random_init_baseline=random_init_baseline, evaluate=evaluate)


def _run(config: ExperimentConfig, output_dir: str, results_path: str, *, progress: bool,
         random_init_baseline: bool, evaluate: Evaluate | None) -> dict[str, Any]:
  train, test = load_splits(config)
  warning = models.layers.bfloat16_warning(config.precision)
  if warning:
    logging.warning(warning)
  if config.pool_grid != 1:  # Before anything is written: the grid must fit the last feature map.
    models.resnet.check_pool_grid(config.encoder, train.image_shape[0], config.pool_grid,
                                  small_input=train.image_shape[0] <= 64,
                                  stem_stride=config.stem_stride)
  kind = config.method_entry.kind
  if kind == "supervised":
    return _run_supervised(config, train, test, output_dir, results_path)
  if kind == "federated":
    results, encoders = runner.run_federated(
        config, train, test, output_dir, progress=progress,
        random_init_baseline=random_init_baseline, init=initial_encoder(config, train.image_shape))
  else:
    if config.probe_dataset:  # The probes read other images than the pretraining's.
      train_labels, test = load_splits(probe_config_of(config))
    else:
      train_labels = train
    results, encoders = _run_centralized(config, train, train_labels, test, output_dir,
                                         progress=progress,
                                         random_init_baseline=random_init_baseline)
    train = train_labels  # What the evaluations below read.
    if config.probe_dataset:
      results["probe_dataset"] = config.probe_dataset
  if config.init_from:
    results["init_from"] = config.init_from
  if evaluate is not None:
    start = time.perf_counter()
    # One encoder, or one per heterogeneous architecture: their mean, and each one's.
    each = {label: evaluate(encoder, train, test) for label, encoder in encoders}
    if len(each) == 1:
      results["evaluations"] = next(iter(each.values()))
    else:
      results["evaluations"] = {k: float(np.mean([e[k] for e in each.values()]))
                                for k in next(iter(each.values()))}
      results["evaluations_each"] = each
    results["evaluation_seconds"] = round(time.perf_counter() - start, 1)
  ssl_model.release(encoders)  # Done with them: a next run of the same built process reuses them.
  if random_init_baseline:
    results["linear_probe_accuracy_raw_pixels"] = evaluation.linear_probe(
        evaluation.raw_pixels(train.image_shape), train, test, config.probe_config())
  rundir.write_atomic(results_path, json.dumps(results, indent=2, sort_keys=True) + "\n")
  return results


def _run_centralized(config: ExperimentConfig, images, train, test, output_dir: str, *,
                     progress: bool, random_init_baseline: bool
                     ) -> tuple[dict[str, Any], list[tuple[str, tf.keras.Model]]]:
  """Pretrains on `images` (the training split of --dataset); the probes read `train` and `test`
  (--probe_dataset's splits, or the same images' with their labels)."""
  if config.batch_size > len(images):
    raise ValueError(f"batch_size {config.batch_size} exceeds the {len(images)} training images "
                     f"of {config.dataset}")
  rundir.write_hparams(config, output_dir)
  # A centralized run starts over when rerun: drop what an interrupted one saved.
  shutil.rmtree(os.path.join(output_dir, "checkpoints"), ignore_errors=True)

  tf.keras.utils.set_random_seed(config.seed)
  build = centralized_model_builder(config, images.image_shape)
  model = build()
  probe = config.probe_config()
  start = time.perf_counter()
  random_acc = (evaluation.linear_probe(model.encoder, train, test, probe)
                if random_init_baseline else None)

  sinks = observers.StepSinks(output_dir)
  with progress_lib.bar(config.steps, desc="pretraining", unit="step", enabled=progress) as bar:

    def on_step(step, loss):
      bar.update(1)
      probed = (config.eval_every and (step + 1) % config.eval_every == 0 and
                step + 1 < config.steps)
      if probed or step % config.log_every == 0 or step == config.steps - 1:
        bar.set_postfix(loss=f"{loss:.2f}")
        values = {"loss": np.float32(loss)}
        if probed:
          values["linear_probe_accuracy"] = np.float32(
              evaluation.linear_probe(model.encoder, train, test, probe))
        sinks.release(step, values)

    history = pretrain(model, images.images, config.parsed, on_step=on_step, build=build)  # Parsed once.
  pretrained_acc = evaluation.linear_probe(model.encoder, train, test, probe)
  save_encoder(output_dir, model.encoder)
  save_heads(output_dir, model)
  results = {
      "method": config.method,
      "dataset": config.dataset,
      "steps": config.steps,
      "final_loss": history[-1],
      "linear_probe_label_fraction": config.eval_label_fraction,
      "linear_probe_accuracy_pretrained": pretrained_acc,
      "seconds": round(time.perf_counter() - start, 1),
  }
  if random_acc is not None:
    results["linear_probe_accuracy_random_init"] = random_acc
  return results, [("centralized", model.encoder)]


def centralized_model_builder(config: ExperimentConfig, image_shape) -> Callable[[], models.SSLModel]:
  """A builder of centralized pretraining's model: the encoder, the projector, and the SSL method's
  predictor where it has one, with `config.head_norm`'s heads (`ssl_model.head_options`)."""
  projector_options, predictor_options = ssl_model.head_options(config)
  with_predictor = ssl_lib.get(config.ssl).predictor

  def build() -> models.SSLModel:
    with models.layers.precision(config.precision):
      encoder = config.build_encoder(image_shape)
      projector = models.build_mlp_head(encoder.output_shape[-1], config.projector,
                                        name="projector", **projector_options)
      predictor = (models.build_mlp_head(config.projector[-1], config.predictor_sizes,
                                         name="predictor", **predictor_options)
                   if with_predictor else None)
    return models.SSLModel(encoder, projector, predictor)
  return build


def _run_supervised(config: ExperimentConfig, train, test, output_dir: str,
                    results_path: str) -> dict[str, Any]:
  rundir.write_hparams(config, output_dir)
  start = time.perf_counter()
  acc = evaluation.supervised_from_scratch(
      lambda: config.build_encoder(train.image_shape),
      train, test, evaluation.FineTuneConfig(
          label_fraction=config.eval_label_fraction, steps=config.steps,
          batch_size=config.batch_size, optimizer=config.optimizer,
          learning_rate=config.learning_rate, seed=config.seed))
  results = {"method": "supervised", "dataset": config.dataset, "steps": config.steps,
             "label_fraction": config.eval_label_fraction, "supervised_accuracy": acc,
             "seconds": round(time.perf_counter() - start, 1)}
  rundir.write_atomic(results_path, json.dumps(results, indent=2, sort_keys=True) + "\n")
  return results


def save_encoder(output_dir: str, encoder: tf.keras.Model) -> None:
  """Saves a centralized run's encoder weights as tff.program state (what bin/evaluate loads)."""
  manager = tff.program.FileProgramStateManager(os.path.join(output_dir, "checkpoints"))
  asyncio.run(manager.save({"encoder_weights": encoder.get_weights()}, version=1))


HEADS_FILE = "heads.npz"


def save_heads(output_dir: str, model: models.SSLModel) -> None:
  """Saves a centralized run's projector (and predictor) weights beside its encoder, as
  `heads.npz` (projector_0, ..., predictor_0, ...): what the projections' statistics are read
  from (`tools/representation_stats.py --projections`). The probes never use them."""
  arrays = {f"projector_{i}": w for i, w in enumerate(model.projector.get_weights())}
  if model.predictor is not None:
    arrays.update({f"predictor_{i}": w for i, w in enumerate(model.predictor.get_weights())})
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  rundir.write_atomic(os.path.join(output_dir, HEADS_FILE), buffer.getvalue())


def load_config(run_dir: str) -> ExperimentConfig:
  """The config of a run folder (its hparams.json)."""
  hparams_path = os.path.join(run_dir, "hparams.json")
  if not os.path.exists(hparams_path):
    raise ValueError(f"{run_dir} is not a run folder (no hparams.json); pass a --output_dir of "
                     f"bin/train")
  fields = rundir.read_hparams(hparams_path)
  known = {f.name for f in dataclasses.fields(ExperimentConfig)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise ValueError(f"{hparams_path} has fields this tff-ssl does not know ({', '.join(unknown)}); "
                     f"it was written by another version: update tff-ssl (git pull)")
  return ExperimentConfig(**fields)


def load_encoder(run_dir: str) -> tuple[ExperimentConfig, tf.keras.Model]:
  """The config and the pretrained Keras encoder of a run folder (its latest checkpoint)."""
  config = load_config(run_dir)
  method = config.method_entry
  if method.kind == "supervised":
    raise ValueError(f"{run_dir} is a supervised baseline run; it has no pretrained encoder")
  manager = tff.program.FileProgramStateManager(os.path.join(run_dir, "checkpoints"))
  train_shape = data_lib.load(config.dataset, "test", data_dir=config.data_dir).image_shape
  if method.federated:
    return config, runner.load_encoder(config, train_shape, manager)
  tf.keras.utils.set_random_seed(config.seed)
  encoder = config.build_encoder(train_shape)
  state, _ = asyncio.run(manager.load_latest({"encoder_weights": encoder.get_weights()}))
  if state is None:
    raise ValueError(f"{run_dir} has no checkpoint yet (the run has not finished); run bin/train "
                     f"to completion first")
  encoder.set_weights([np.asarray(w) for w in state["encoder_weights"]])
  return config, encoder


def initial_encoder(config: ExperimentConfig, image_shape) -> dict[str, np.ndarray] | None:
  """--init_from's encoder weights by path (`functional.weight_paths`), or None without it; a
  one-line ValueError where the folder holds no finished encoder of these images' shape."""
  if not config.init_from:
    return None
  try:
    _, encoder = load_encoder(config.init_from)
  except ValueError as e:
    raise ValueError(f"--init_from={config.init_from}: {e}") from None
  shape = tuple(encoder.input_shape[1:])
  if shape != tuple(image_shape):
    raise ValueError(f"--init_from={config.init_from}: its encoder reads images of shape {shape}, "
                     f"this run's are {tuple(image_shape)}; pretrain it on images of this shape")
  return {path: v.numpy() for path, v in functional.weight_paths(encoder).items()}


EVALUATE_PROTOCOLS = ("linear_probe", "tuned_linear_probe", "fine_tune", "supervised")


def evaluate_run(run_dir: str, protocol: str = "linear_probe", *, label_fraction: float = 0.1,
                 seed: int = 0, dataset: str | None = None,
                 **overrides) -> tuple[str, dict[str, Any]]:
  """Evaluates a finished run folder's encoder (what bin/evaluate does): `protocol` one of
  EVALUATE_PROTOCOLS ("supervised": the run's architecture trained from scratch on the labels),
  `overrides` the protocol's steps / learning_rate / batch_size (None: its default), on the run's
  dataset or on `dataset` (images of the same shape: an encoder pretrained on synthetic images
  probed on the data it is meant for; its splits as the run's: train and test, or train and the
  validation split with the run's validation_fraction). Writes and returns (path, record):
  eval_<protocol>_<fraction>_seed<seed>[_<dataset>].json in `run_dir`; the tuned probe's record
  holds its chosen L2 and each candidate's held-out accuracy."""
  if protocol not in EVALUATE_PROTOCOLS:
    raise ValueError(f"unknown evaluation protocol {protocol!r}; choose one of "
                     f"{list(EVALUATE_PROTOCOLS)}")
  overrides = {k: v for k, v in overrides.items() if v is not None}
  if protocol == "tuned_linear_probe" and overrides:
    raise ValueError(f"tuned_linear_probe chooses its own regularization and takes no "
                     f"{'/'.join(sorted(overrides))}; drop --{' --'.join(sorted(overrides))}")
  config, encoder = load_encoder(run_dir)
  if dataset is None and config.probe_dataset:  # The run's own probes read it.
    dataset = config.probe_dataset
  config = dataclasses.replace(config, probe_dataset="")
  other = dataset not in (None, config.dataset)
  if other:
    if dataset not in data_lib.SOURCES:
      raise ValueError(f"unknown dataset {dataset!r}; choose one of {sorted(data_lib.SOURCES)}")
    shape, theirs = data_lib.image_shape(dataset), tuple(encoder.input_shape[1:])
    if tuple(shape) != theirs:
      raise ValueError(f"--dataset={dataset} has images of shape {tuple(shape)}; {run_dir}'s "
                       f"encoder reads {theirs}: choose a dataset of that shape")
    config = dataclasses.replace(config, dataset=dataset)
  train, test = load_splits(config)
  record: dict[str, Any] = {"protocol": protocol, "label_fraction": label_fraction, "seed": seed,
                            "dataset": config.dataset, **overrides}
  if protocol == "tuned_linear_probe":
    fit = evaluation.tuned_linear_probe_fit(encoder, train, test, evaluation.TunedLinearProbeConfig(
        label_fraction=label_fraction, seed=seed))
    record.update(accuracy=fit.test_accuracy, l2=fit.l2,
                  holdout_accuracy={f"{k:g}": v for k, v in fit.holdout_accuracy.items()})
  elif protocol == "linear_probe":
    record["accuracy"] = evaluation.linear_probe(encoder, train, test, evaluation.LinearProbeConfig(
        label_fraction=label_fraction, seed=seed, **overrides))
  else:
    cfg = evaluation.FineTuneConfig(label_fraction=label_fraction, seed=seed, **overrides)
    record["accuracy"] = (
        evaluation.fine_tune(encoder, train, test, cfg) if protocol == "fine_tune" else
        evaluation.supervised_from_scratch(lambda: tf.keras.models.clone_model(encoder), train,
                                           test, cfg))
  path = os.path.join(run_dir, f"eval_{protocol}_{label_fraction:g}_seed{seed}"
                             f"{'_' + dataset if other else ''}.json")
  rundir.write_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
  return path, record
