"""A federated pretraining run: partition, sample clients, run rounds, checkpoint, resume, evaluate.

`run_federated` wires the run; `run_rounds` is its loop, and what each round's results go to is an
observer (`tff_ssl.observers`): program state (server state and the released metrics, after each
`--checkpoint_every` rounds) through `tff.program.FileProgramStateManager` (`<run>/checkpoints`);
per-round metrics through `tff.program` release managers to `<run>/metrics.csv` and TensorBoard
(`<run>/tensorboard`); each round's wall time and resident memory (this process and the TFF worker)
to `<run>/resources.csv`, kept apart because they vary between machines. A rerun with the same output
folder and the same hyperparameters resumes after the latest checkpoint; since client sampling and
augmentations are functions of (seed, round), the resumed run ends where the uninterrupted one would.
The method's registry entry is resolved once, when the config is made (`config.method_entry`).
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import os
import sys
import time
from typing import Any, Iterator

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_ssl import evaluation, rundir, runtime
from tff_ssl import observers as observers_lib
from tff_ssl import data as data_lib
from tff_ssl.data.client_data import PartitionedClientData
from tff_ssl.federated import client_state, common, functional, sampling, ssl_model
from tff_ssl.federated import process as process_lib
from tff_ssl.federated.server_step import ServerState
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.config_fields import Field

# Config fields (`ExperimentConfig`), declared by their owner.
ROUNDS = Field("rounds", 100, "Federated rounds.", lower=1)
INIT_FROM = Field("init_from", "", "Federated runs: start from the encoder of this finished run "
                  "folder (its latest checkpoint; e.g. a centralized run on "
                  "--dataset=synthetic_leaves, which touches no private data): its weights "
                  "replace the encoder's initialization in every part of the process, the heads "
                  "start fresh. The probe of the starting encoder is reported as "
                  "linear_probe_accuracy_init_from (empty: a random encoder).", kind=str)


ENCODER_NAME = ssl_model.ENCODER_NAME
ssl_model_builder = ssl_model.ssl_model_builder


def build_process(config, model: FunctionalModel, image_shape, auxiliary=None):
  """The TFF process of `config`'s method (`tff_ssl.methods`) over `model`; `auxiliary`: the
  server's images (`auxiliary_split`) for a method that has them (None: a process that will not
  train, e.g. to read a checkpoint). Rounds across workers (`runtime.configured_workers`) run
  under TFF's mergeable execution (`process.BuildContext.mergeable`)."""
  context = process_lib.BuildContext(
      auxiliary=auxiliary if config.method_entry.auxiliary else None,
      mergeable=bool(runtime.configured_workers()))
  return process_lib.check(config.method_entry.build(config, model, image_shape, context))


def auxiliary_split(config, num_images: int) -> tuple[np.ndarray, np.ndarray]:
  """(indices of the training images the clients are partitioned from, indices of the server's
  auxiliary images): for a method with an auxiliary split (LW-FedSSL), a random
  `auxiliary_fraction` of the images, drawn from the seed, goes to the server and to no client;
  otherwise every image is the clients'."""
  everything = np.arange(num_images)
  if not config.method_entry.auxiliary:
    return everything, everything[:0]
  k = int(round(config.auxiliary_fraction * num_images))
  if not 2 <= k < num_images:
    raise ValueError(f"auxiliary_fraction {config.auxiliary_fraction} of {num_images} images gives "
                     f"the server {k}; choose a fraction that leaves it >= 2 images and the clients "
                     f"some")
  order = np.random.default_rng([config.seed, 0xA0C5]).permutation(num_images)
  return np.sort(order[k:]), np.sort(order[:k])


def partition(config, train: data_lib.ImageSet):
  """The run's clients: a list (or array) of index rows into `train`, over the images the server
  does not hold (`auxiliary_split`)."""
  pool, held = auxiliary_split(config, len(train))
  if not len(held):
    return _partition(config, train)
  rows = _partition(config, train.subset(pool))
  return pool[rows] if isinstance(rows, np.ndarray) else [pool[np.asarray(r)] for r in rows]


def min_samples_per_client(config) -> int:
  """Fewest images a client of this run's method can train on (within-client losses need 2, and so
  do batch-statistics heads)."""
  need = config.method_entry.min_samples(config)
  return max(need, 2) if getattr(config, "head_norm", "group") == "batch" else need


def _partition(config, train: data_lib.ImageSet):
  return data_lib.PARTITIONS[config.partition].split(config, train.labels,
                                                     min_samples_per_client(config))


keras_encoder = ssl_model.keras_encoder


# Built (builder, model, process) by what determines them, the last CACHE_SIZE kept only where
# `CACHE_ENV` is "1" (the test suite, whose in-process runs build one config again and again).
# A built process is pure (its state is passed in), and a second use skips its build and TFF's
# compilation of its computations (5-7 s a small process).
CACHE_ENV = "TFF_SSL_CACHE_PROCESSES"
CACHE_SIZE = 4
_BUILT: dict = {}


def _build(config, train: data_lib.ImageSet, init: dict | None = None):
  tf.keras.utils.set_random_seed(config.seed)
  _, held = auxiliary_split(config, len(train))
  auxiliary = common.client_inputs(train.images[held], held)
  key = (config, train.image_shape, hashlib.sha256(train.images[held].tobytes()).hexdigest(),
         held.tobytes(), tuple(runtime.configured_workers()))
  if os.environ.get(CACHE_ENV) == "1" and key in _BUILT:
    return _BUILT[key]
  builder = ssl_model_builder(config, train.image_shape)
  model = FunctionalModel(builder)
  if init is not None:  # --init_from: every part of the process starts from the given encoder.
    model.initial_weights = functional.with_encoder(model, init, ENCODER_NAME + "/",
                                                    config.init_from)
  built = builder, model, build_process(config, model, train.image_shape, auxiliary)
  if os.environ.get(CACHE_ENV) == "1":
    while len(_BUILT) >= CACHE_SIZE:  # The oldest goes: a process holds its model's weights.
      del _BUILT[next(iter(_BUILT))]
    _BUILT[key] = built
  return built


def _setup(config, train: data_lib.ImageSet, clients_rows, init: dict | None = None):
  """(Keras builder, FunctionalModel, TFF process, round -> (that round's client ids, their inputs))
  of a run; initialization (`init`: the encoder's weights by path, --init_from) and client sampling
  from `config.seed`."""
  clients = PartitionedClientData(train, clients_rows)
  builder, model, process = _build(config, train, init)
  sample = sampling.round_sampler(config.client_sampling, clients.num_clients,
                                  config.clients_per_round, config.seed)

  def round_clients(r: int) -> tuple[list[int], list[dict]]:
    ids = sample(r)
    return ids, [common.client_inputs(train.images[clients.partition[c]], clients.partition[c])
                 for c in ids]
  return builder, model, process, round_clients


def trajectory(config, train: data_lib.ImageSet, rounds: int
               ) -> Iterator[tuple[int, FunctionalModel, list[np.ndarray], dict[str, Any]]]:
  """Runs `rounds` rounds of `config` writing nothing; yields (round, the model (its weights' names
  and initial values), the weights after the round, the round's metrics): the same numbers as
  `run_federated`'s, for diagnostics such as tools/weight_norms.py."""
  _, model, process, round_clients = _setup(config, train, partition(config, train))
  state = process.initialize()
  store = client_state.MemoryClientStateStore()
  for r in range(rounds):
    ids, clients = round_clients(r)
    state, metrics = process.next(state, clients, client_ids=ids, store=store)
    yield r, model, [np.asarray(w) for w in state.weights], metrics


def check_samples(config) -> None:
  """ValueError where a fixed-size partition gives clients fewer images than the method needs."""
  need = min_samples_per_client(config)
  if data_lib.PARTITIONS[config.partition].fixed_size and config.samples_per_client < need:
    why = ("its batch-statistics heads (--head_norm=batch)"
           if need > config.method_entry.min_samples(config) else "its within-client loss")
    raise ValueError(f"{config.method} with --ssl={config.ssl} needs >= {need} samples per client "
                     f"for {why}; got samples_per_client={config.samples_per_client}. Use dcco"
                     f"{' or --head_norm=group' if 'heads' in why else ''}")


def run_rounds(process, state: ServerState, rounds: int, round_clients, store,
               observers: list[observers_lib.Observer], guard) -> ServerState:
  """Rounds from `state` until `rounds` are done, each observed (`observers`: module docstring);
  `guard(r)` wraps round r's training (`observers.worker_guard`). Returns the last state."""
  try:
    while state.round_num < rounds:
      runtime.raise_if_interrupted()
      r = state.round_num
      for o in observers:
        o.before_round(r)
      ids, clients = round_clients(r)
      with guard(r):
        state, metrics = process.next(state, clients, client_ids=ids, store=store)
      released = {"loss": np.float32(metrics["loss"])}
      for o in observers:
        o.after_round(r, state, metrics, released)
    runtime.raise_if_interrupted()
  except (KeyboardInterrupt, SystemExit):
    runtime.interruption_handled()  # Delivered: a later run in this process starts afresh.
    raise
  finally:
    for o in observers:
      o.close()
  return state


def run_federated(config, train: data_lib.ImageSet, test: data_lib.ImageSet, output_dir: str, *,
                  progress: bool, random_init_baseline: bool = True, init: dict | None = None
                  ) -> tuple[dict[str, Any], list[tuple[str, tf.keras.Model]]]:
  """Runs (or resumes) federated pretraining per `config` (from the encoder `init`, path -> value,
  where --init_from gives one); returns the results and the (label, encoder) pairs it evaluated
  (`process.encoders`)."""
  method = config.method_entry
  check_samples(config)
  clients_rows = partition(config, train)  # Raises ValueError before anything is written.
  _open_run_folder(config, output_dir)
  _, model, process, round_clients = _setup(config, train, clients_rows, init)  # Checks `init`.
  rundir.create(output_dir)
  rundir.write_atomic(os.path.join(output_dir, "hparams.json"), rundir.hparams_json(config))
  state_manager = tff.program.FileProgramStateManager(os.path.join(output_dir, "checkpoints"),
                                                      keep_total=2)
  text = observers_lib.text_columns(config)
  state, history, store, average = _restore(
      process, state_manager, output_dir, {**observers_lib.constant_columns(config), **text},
      lambda s, loaded: observers_lib.weight_average(config, model, s, loaded))
  view = average.view if average is not None else (lambda s: s)  # What the probes read.
  ledger = observers_lib.privacy_ledger(config)
  watch = ([observers_lib.FiniteLoss(method.hint(config), output_dir, state_manager)] +
           ([observers_lib.WeightNorms(model)] if config.measure_weight_norms else []) +
           ([ledger] if ledger is not None else []) +
           ([average] if average is not None else []) + [
               observers_lib.Evaluator(config, process, store, train, test, view),
               observers_lib.MetricSinks(output_dir, history, text),
               observers_lib.Resources(output_dir, store),
               observers_lib.Checkpoints(state_manager, history, store, config.checkpoint_every,
                                         config.rounds, average),
               observers_lib.ProgressBar(config.rounds, state.round_num, progress,
                                         ledger.privacy.convention.label if ledger else "")])
  start = time.perf_counter()
  state = run_rounds(process, state, config.rounds, round_clients, store, watch,
                     lambda r: observers_lib.worker_guard(r, state_manager))
  evaluated, encoders = final_evaluation(config, process, view(state), store, train, test,
                                         random_init_baseline)
  results = {"method": config.method, "dataset": config.dataset, "rounds": config.rounds,
             "final_loss": _read_last_loss(os.path.join(output_dir, "metrics.csv")),
             "linear_probe_label_fraction": config.eval_label_fraction, **evaluated}
  if ledger is not None:
    results.update(ledger.summary())
  results["seconds"] = round(time.perf_counter() - start, 1)
  return results, encoders


def _open_run_folder(config, output_dir: str) -> None:
  """Checks that `output_dir` can hold the run: new, or a run of the same settings to resume (then
  locked first: another run may be writing it)."""
  rundir.check_creatable(output_dir)
  hparams_path = os.path.join(output_dir, "hparams.json")
  if os.path.exists(hparams_path):
    rundir.lock(output_dir)
    _check_resumable(hparams_path, config, output_dir)


def _restore(process, state_manager, output_dir: str, constants=None,
             make_average=lambda state, loaded: None):
  """(The server state to start from, the released metrics so far, the client-state store, the
  weights' average or None): the newest readable checkpoint's, else the initial ones
  (`make_average(initial state, loaded program state or None)`: `observers.weight_average`). The
  CSVs are cut back to what the checkpoint covers (no partial row, no round it does not hold), and
  the store forgets what later rounds wrote."""
  state = process.initialize()
  average = make_average(state, None)
  loaded = load_newest_readable(state_manager, program_state(
      state, [], average.weights if average is not None else None))
  history = []  # The rounds' released metrics (`RELEASED`), checkpointed with the state.
  if loaded is not None:
    state, history = ServerState.from_program_state(loaded), list(loaded["metrics"])
    average = make_average(state, loaded)
  restore_metrics(os.path.join(output_dir, "metrics.csv"), history, constants)
  for name in ("resources.csv", "aggregation.csv"):
    truncate_csv(os.path.join(output_dir, name), state.round_num)
  store = (client_state.DiskClientStateStore(os.path.join(output_dir, "client_states"))
           if process.keeps_client_state else None)
  if store is not None:
    store.rollback(state.round_num)
  return state, history, store, average


def final_evaluation(config, process, state, store, train, test, random_init_baseline: bool):
  """(The results' evaluations: the linear probe, and k-NN where the run monitors it, of the
  process's encoders after the rounds and at initialization; the encoders). One encoder (the global
  model's), or one per heterogeneous architecture: their mean, and each."""
  probe, knn = config.probe_config(), config.knn_config()
  evaluations = [("linear_probe", lambda e: evaluation.linear_probe(e, train, test, probe))]
  if config.knn_every:
    evaluations.append(("knn", lambda e: evaluation.knn_monitor(e, train, test, knn)))
  # With --init_from the encoder it started from is not a random one, and is named for what it is.
  start = "init_from" if config.init_from else "random_init"
  measured = {}
  # The initial encoders first, given back before the pretrained ones are made from the same Keras
  # models (`ssl_model.release`).
  for which in ((start,) if random_init_baseline else ()) + ("pretrained",):
    encoders = process.encoders(None if which == start else state, store)
    for name, evaluate in evaluations:
      measured[name, which] = observers_lib.mean_of(encoders, evaluate)
    if which == start:
      ssl_model.release(encoders)
  results = {}
  for name, _ in evaluations:
    for which in ("pretrained", start):
      if (name, which) in measured:
        mean, each = measured[name, which]
        results[f"{name}_accuracy_{which}"] = mean
        if len(each) > 1:
          results[f"{name}_accuracy_{which}_each"] = each
  return results, encoders


# The run's observers' parts that other modules use by these names.
CSVReleaseManager = observers_lib.CSVReleaseManager
PrivacyLedger, privacy_ledger = observers_lib.PrivacyLedger, observers_lib.privacy_ledger
RELEASED, program_state = observers_lib.RELEASED, observers_lib.program_state


def restore_metrics(path: str, history, constants=None) -> None:
  """Writes `path` (metrics.csv) anew with the rounds of `history` (`program_state`'s metrics), as
  the run released them, each with the run's `constants` (`observers.constant_columns`): a row cut
  short by a kill, or rows of rounds after the checkpoint, go; rows lost since the checkpoint come
  back."""
  if os.path.exists(path):
    os.remove(path)
  if not len(history):
    return
  release = CSVReleaseManager(path, key_fieldname="round")
  for r, row in enumerate(history):
    values = {k: np.float32(v) for k, v in zip(RELEASED, row) if np.isfinite(v)}
    values.update(constants or {})
    asyncio.run(release.release(values, key=r))


def truncate_csv(path: str, rounds_done: int) -> None:
  """Keeps the complete rows of a per-round CSV (`round` first) of rounds < `rounds_done`: a row cut
  short by a kill, or of a round after the checkpoint the run resumes from, goes."""
  if not os.path.exists(path):
    return
  with open(path, newline="") as f:
    text = f.read()
  lines = text.split("\n")
  complete = lines[:-1]  # The last piece has no newline: empty, or cut short.
  if not complete:
    os.remove(path)
    return
  width = len(next(csv.reader([complete[0]])))
  kept = [complete[0]] + [
      line for line in complete[1:]
      if len(row := next(csv.reader([line]))) == width and row[0].isdigit() and
      int(row[0]) < rounds_done]
  if len(kept) != len(complete) or lines[-1]:
    rundir.write_atomic(path, "\n".join(kept) + "\n")


def check_workers(config, workers: list[str]) -> None:
  """Raises ValueError if a round of `config` has fewer TFF client slots than `workers` (a worker
  without clients would idle): the grouped simulation packs a round into ceil(clients_per_round /
  group_size) slots (group_size 0: one)."""
  if len(workers) < 2:
    return
  if config.client_sampling != "fixed":
    raise ValueError(f"--client_sampling={config.client_sampling} gives rounds of varying size, and "
                     f"--workers splits a round's slots over {len(workers)} workers for a fixed "
                     f"size: use --client_sampling=fixed, or run without --workers")
  per_round = config.clients_per_round
  slots = per_round if config.simulation == "reference" else (
      -(-per_round // config.group_size) if config.group_size else 1)
  if slots < len(workers):
    most = max(1, per_round // len(workers))
    raise ValueError(f"--workers names {len(workers)} workers but a round has {slots} TFF client "
                     f"slot(s) (clients_per_round={per_round}, group_size={config.group_size}): "
                     f"set --group_size={most} or less so each worker gets clients")


def load_newest_readable(manager: tff.program.FileProgramStateManager, structure):
  """The newest checkpoint of `manager` that reads back, or None if there is none.

  A checkpoint cut short (a crash or a full disk while it was written) does not read back; it is
  renamed `unreadable_program_state_<round>` (so the rerun can save that round again), one line on
  stderr says so, and the one before it is loaded. If no checkpoint reads back, which is what a run
  folder of another version of the code gives, this raises ValueError rather than start over.
  """
  versions = sorted(asyncio.run(manager.get_versions()) or [], reverse=True)
  failures = []
  for version in versions:
    try:
      loaded = asyncio.run(manager.load(version, structure))
    except Exception as e:  # pylint: disable=broad-except  # Any reader error: try an older one.
      failures.append((version, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
      continue
    root = manager._root_dir  # pylint: disable=protected-access
    for bad, reason in failures:
      path = manager._get_path_for_version(bad)  # pylint: disable=protected-access
      os.rename(path, os.path.join(root, f"unreadable_program_state_{bad}"))
      print(f"warning: checkpoint of round {bad} does not read back ({reason}); moved aside, "
            f"resuming from the checkpoint of round {version}", file=sys.stderr)
    return loaded
  if failures:
    version, reason = failures[0]
    raise ValueError(f"no checkpoint in {manager._root_dir} reads back (round {version}: {reason}); "  # pylint: disable=protected-access
                     f"a run folder of another version of tff-ssl cannot be resumed: choose another "
                     f"--output_dir")
  return None


def _check_resumable(hparams_path: str, config, output_dir: str) -> None:
  """Raises ValueError unless the run folder's hparams.json describes `config`'s run
  (`rundir.compare_settings`: a field added since, at its default, is the run's)."""
  missing, extra, equal = rundir.compare_settings(rundir.read_hparams(hparams_path, type(config)),
                                                  config)
  if missing or extra:
    raise ValueError(f"{output_dir} holds a run written by another version of tff-ssl (its "
                     f"hparams.json lacks {missing or 'nothing'} and has {extra or 'nothing'} more); "
                     f"it cannot be resumed: choose another --output_dir")
  if not equal:
    raise ValueError(f"{output_dir} holds a run with other hyperparameters; resume it with the same "
                     f"flags or choose another --output_dir")


def load_encoder(config, image_shape, manager) -> tf.keras.Model:
  """The Keras encoder held by the latest checkpoint of a federated run."""
  tf.keras.utils.set_random_seed(config.seed)
  model = FunctionalModel(ssl_model_builder(config, image_shape))
  process = build_process(config, model, image_shape)
  initial = process.initialize()
  average = observers_lib.weight_average(config, model, initial, None)
  loaded = load_newest_readable(manager, program_state(
      initial, [], average.weights if average is not None else None))
  if loaded is None:
    raise ValueError("the run has no checkpoint yet; run bin/train first")
  state = ServerState.from_program_state(loaded)
  if average is not None:  # --ema_eval: the encoder its probes read, the average.
    state = observers_lib.weight_average(config, model, state, loaded).view(state)
  # One global encoder; a process whose encoders live in its clients' states refuses (no store).
  return process.encoders(state, None)[0][1]


def _divergence_hint(config) -> str:
  """What to try when a run's loss became NaN or infinite (the method's hint)."""
  return config.method_entry.hint(config)


def _read_last_loss(path: str) -> float:
  with open(path) as f:
    rows = [line.strip().split(",") for line in f if line.strip()]
  header = rows[0]
  return float(rows[-1][header.index("loss")])
