"""What watches a federated run's rounds (`runner.run_rounds`), in the manner of
`tff.learning.programs.train_model`: the loop trains, each observer does one thing with each round.

    before_round(r)                          before round r's clients train (timing)
    after_round(r, state, metrics, released) after it: `state` the new server state, `metrics` what
                                             the process returned, `released` what goes to
                                             metrics.csv (an observer may add to it: epsilon, a probe)
    close()                                  on every exit, normal or not

The run's observers, in their order (`runner.run_federated`): `FiniteLoss` (stops on a NaN loss with
the method's hint), `WeightNorms`, `PrivacyLedger` (epsilon after each round), `Evaluator` (periodic
linear probe and k-NN), `MetricSinks` (metrics.csv, TensorBoard, aggregation.csv), `Resources`
(resources.csv: wall time and memory, apart because they vary between machines), `Checkpoints`
(program state and the client-state store), `ProgressBar`. `worker_guard` turns a remote worker that
stopped answering into one line.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import shutil
import time

import numpy as np
import tensorflow_federated as tff

from tff_ssl import evaluation, runtime
from tff_ssl import privacy as privacy_lib
from tff_ssl import progress as progress_lib
from tff_ssl.federated import common
from tff_ssl.federated import server_step, ssl_model
from tff_ssl.privacy import accounting
from tff_ssl.config_fields import Field

# Config fields (`ExperimentConfig`), declared by their owner.
EVAL_EVERY = Field("eval_every", 0, "Rounds (steps, centralized) between linear probes (0: only "
                   "at the end).", lower=0)
KNN_EVERY = Field("knn_every", 0, "Federated runs: rounds between kNN monitors (k = 200, t = 0.1 "
                  "on every train label, FedEMA's code), also run at the end; 0: none.",
                  lower=0, note="0: no kNN monitor")
MEASURE_WEIGHT_NORMS = Field("measure_weight_norms", False, "Federated runs: write each kernel's "
                             "norm over its initial norm after every round (`kernel_norm/*` in "
                             "aggregation.csv): how aggregation changes the global model's scale.")
CHECKPOINT_EVERY = Field("checkpoint_every", 10, "Rounds between checkpoints (a SavedModel write "
                         "costs seconds).", lower=1)
LOG_EVERY = Field("log_every", 10, "Write the loss every N steps.", lower=1)
EMA_EVAL = Field("ema_eval", 0.0, "Federated runs: the probes (periodic and final, and "
                 "bin/evaluate) read an exponential moving average of the server's weights, "
                 "decay min(beta, (1 + t) / (10 + t)) after round t (De et al. 2022); "
                 "checkpointed with the run.",
                 lower=0, upper=1, open_upper=True, note="0: the weights themselves")


# What metrics.csv holds per round; each checkpoint holds them too (`Checkpoints.program_state`), so
# a resumed run writes back exactly the rounds its checkpoint covers (`runner.restore_metrics`).
RELEASED = ("loss", "linear_probe_accuracy", "knn_accuracy", "epsilon")


class Observer:
  """One thing done with each round (module docstring). Subclasses override what they use."""

  def before_round(self, round_num: int) -> None:
    del round_num

  def after_round(self, round_num: int, state, metrics: dict, released: dict) -> None:
    del round_num, state, metrics, released

  def close(self) -> None:
    pass


class CSVReleaseManager(tff.program.CSVFileReleaseManager):
  """TFF's CSV release manager without a rewrite of the whole file on every release.

  TFF 0.87's `release(value, key)` first removes the rows with keys >= `key`; its early return for
  "nothing to remove" tests `key - 1 > latest key`, so releasing round r after round r - 1 reads and
  rewrites every row so far: O(rounds^2) over a run, 5 ms a release at 1,000 rows (two CSVs a round:
  a third of a mini DCCO round). Here nothing is read when no row can have a larger key; a resumed
  run releasing an earlier round still drops the later rows (TFF's path).
  """

  async def _remove_values_greater_than_key(self, key: int) -> None:
    if self._latest_key is None or key >= self._latest_key:
      return
    await super()._remove_values_greater_than_key(key)


def kept_checkpoint(state_manager) -> str:
  """Which checkpoint a rerun resumes from, in words."""
  kept = asyncio.run(state_manager.get_versions())
  return f"the checkpoint of round {max(kept)}" if kept else "the start"


@contextlib.contextmanager
def worker_guard(round_num: int, state_manager):
  """Round `round_num`'s training: a remote worker that died becomes one line naming it and what to
  do (`runtime.WorkerUnavailableError`), not a gRPC traceback; anything else passes through."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    down = (runtime.workers_down(runtime.configured_workers())
            if runtime.configured_workers() else [])
    if not down and not isinstance(e, runtime.WorkerUnavailableError):
      raise
    which = f"worker {', '.join(down)} stopped answering" if down else str(e)
    raise runtime.WorkerUnavailableError(
        f"round {round_num}: {which}; restart it (bin/worker) and rerun the same command to resume "
        f"from {kept_checkpoint(state_manager)}") from None


class FiniteLoss(Observer):
  """Stops the run where a round's loss is NaN or infinite: FloatingPointError with the method's
  hint (`hint`) and the checkpoint kept."""

  def __init__(self, hint: str, output_dir: str, state_manager):
    self.hint, self.output_dir, self.state_manager = hint, output_dir, state_manager

  def after_round(self, round_num, state, metrics, released):
    if not np.isfinite(metrics["loss"]):
      kept = asyncio.run(self.state_manager.get_versions())
      kept = f"its checkpoint of round {max(kept)} is kept" if kept else "it has no checkpoint"
      raise FloatingPointError(f"round {round_num}: loss became {metrics['loss']}; {self.hint} in "
                               f"a new --output_dir ({self.output_dir}: {kept})")


class WeightNorms(Observer):
  """Each kernel's norm relative to its initialization, added to the round's aggregation.csv
  (`--measure_weight_norms`; a process with one global model)."""

  def __init__(self, model):
    self.model = model

  def after_round(self, round_num, state, metrics, released):
    if len(state.weights) == len(self.model.names):
      metrics["aggregation"] = collections.OrderedDict(
          list((metrics.get("aggregation") or {}).items()) +
          list(common.kernel_norms(self.model.names, self.model.initial_weights,
                                   state.weights).items()))


class PrivacyLedger(Observer):
  """A DP run's accounting: each round's releases (the events its process reports, as TFF's DP
  factory records them) composed under the run's client sampling (`--client_sampling`: fixed-size
  without replacement, or Poisson) by its accountant (`--dp_accountant`: RDP or PLD), epsilon at
  delta = 1 / population after every round (`privacy.accounting`), released as `epsilon`, and its
  convention beside it (`convention_fields`; metrics.csv's `epsilon_convention`). With a simulated noise cohort K'
  (`--dp_noise_cohort`) `epsilon` is the K'-client run's (its noise multiplier, q = K' / N:
  the label says so) and `epsilon_actual` this run's own (the scaled noise, q = K / N). A resumed
  run's earlier rounds ran the same mechanism: they enter the ledger with the first round it runs."""

  def __init__(self, config):
    self.config = config
    self.privacy = privacy_lib.from_config(config)
    p = self.privacy
    self.ledger = accounting.Ledger(p.delta, p.sampling, p.accountant)
    self.actual = (accounting.Ledger(p.delta, p.sampling, p.accountant)
                   if p.noise_cohort else None)
    self.noise_multipliers: list[float] = []

  def after_round(self, round_num, state, metrics, released):
    released["epsilon"] = np.float32(self.add(round_num, metrics.pop("dp_events")))
    released.update(constant_columns(self.config))
    if self.actual is not None:  # This run's own epsilon, beside the simulated cohort's.
      metrics["aggregation"] = collections.OrderedDict(
          list((metrics.get("aggregation") or {}).items()) +
          [("epsilon_actual", np.float32(self.actual.epsilon()))])

  def add(self, round_num: int, events) -> float:
    """Epsilon after round `round_num`, whose releases were `events` (as accounted: module doc)."""
    p = self.privacy
    count = round_num + 1 - sum(self.ledger.rounds.values())
    if self.actual is not None:
      self.actual.add(accounting.sampled_round(events, p.population, p.clients_per_round,
                                               p.sampling), count=count)
      events = [accounting.scaled(e, 1.0 / p.noise_scale) for e in events]
    self.ledger.add(accounting.sampled_round(events, p.population, p.accounted_cohort, p.sampling),
                    count=count)
    self.noise_multipliers = [accounting.noise_multiplier(e) for e in events]
    return self.ledger.epsilon()

  def summary(self) -> dict:
    out = {"dp": self.config.dp, "epsilon": self.ledger.epsilon(), "delta": self.privacy.delta,
           "dp_noise_multiplier": self.noise_multipliers[0] if self.noise_multipliers else None,
           "dp_rounds": sum(self.ledger.rounds.values()),
           "client_sampling": self.privacy.sampling, **convention_fields(self.privacy.convention)}
    if self.actual is not None:
      out.update(dp_noise_cohort=self.privacy.noise_cohort, dp_label=self.privacy.label,
                 epsilon_actual=self.actual.epsilon(),
                 dp_noise_multiplier_actual=(self.noise_multipliers[0] * self.privacy.noise_scale
                                             if self.noise_multipliers else None))
    return out


def constant_columns(config) -> dict:
  """Columns of every metrics.csv row that mark how the run's numbers are to be read: a simulated
  noise cohort's K' (`dp_noise_cohort`: "noise simulated for a cohort of K'")."""
  cohort = getattr(config, "dp_noise_cohort", 0) if getattr(config, "dp", "off") != "off" else 0
  return {"dp_noise_cohort": np.float32(cohort)} if cohort else {}


def convention_fields(conv: accounting.Convention) -> dict:
  """What results.json carries beside epsilon: how it is stated."""
  return {"dp_accountant": conv.accountant, "dp_relation": conv.relation,
          "dp_convention": conv.key, "dp_convention_label": conv.label}


def text_columns(config) -> dict:
  """Text columns of every metrics.csv row (not TensorBoard's, which holds numbers): a DP run's
  `epsilon_convention` (`accounting.Convention.key`, e.g. "pld/poisson/add_remove")."""
  if getattr(config, "dp", "off") == "off":
    return {}
  return {"epsilon_convention": privacy_lib.from_config(config).convention.key}


def privacy_ledger(config) -> PrivacyLedger | None:
  """The run's `PrivacyLedger`, where it runs with --dp."""
  return PrivacyLedger(config) if getattr(config, "dp", "off") != "off" else None


def mean_of(encoders, evaluate) -> tuple[float, dict[str, float]]:
  """(the mean of `evaluate(encoder)` over (label, encoder) pairs, each label's value)."""
  values = {label: float(evaluate(encoder)) for label, encoder in encoders}
  return float(np.mean(list(values.values()))), values


class Evaluator(Observer):
  """The periodic linear probe (`--eval_every`) and k-NN monitor (`--knn_every`) of the process's
  encoders, released as `linear_probe_accuracy` and `knn_accuracy` (not after the last round: the
  run's final evaluation covers it)."""

  def __init__(self, config, process, store, train, test, view=lambda state: state):
    self.config, self.process, self.store, self.view = config, process, store, view
    probe, knn = config.probe_config(), config.knn_config()
    self.evaluations = (
        ("linear_probe_accuracy", config.eval_every,
         lambda e: evaluation.linear_probe(e, train, test, probe)),
        ("knn_accuracy", config.knn_every, lambda e: evaluation.knn_monitor(e, train, test, knn)))

  def after_round(self, round_num, state, metrics, released):
    done = round_num + 1
    for key, every, evaluate in self.evaluations:
      if every and done % every == 0 and done < self.config.rounds:
        encoders = self.process.encoders(self.view(state), self.store)
        released[key] = np.float32(mean_of(encoders, evaluate)[0])
        ssl_model.release(encoders)


class MetricSinks(Observer):
  """metrics.csv and TensorBoard (`released`), aggregation.csv (the round's measurements: many
  columns), and `history`, the released rows a checkpoint holds."""

  def __init__(self, output_dir: str, history: list, text: dict | None = None):
    self.history, self.text = history, text or {}
    self.csv = CSVReleaseManager(os.path.join(output_dir, "metrics.csv"), key_fieldname="round")
    self.tensorboard = tff.program.TensorBoardReleaseManager(os.path.join(output_dir, "tensorboard"))
    self.aggregation = CSVReleaseManager(os.path.join(output_dir, "aggregation.csv"),
                                         key_fieldname="round")

  def after_round(self, round_num, state, metrics, released):
    asyncio.run(self.csv.release({**released, **self.text}, key=round_num))
    self.history.append([released.get(k, np.nan) for k in RELEASED])
    asyncio.run(self.tensorboard.release(released, key=round_num))
    if metrics.get("aggregation"):
      asyncio.run(self.aggregation.release(metrics["aggregation"], key=round_num))
      asyncio.run(self.tensorboard.release({"aggregation": metrics["aggregation"]}, key=round_num))


class StepSinks:
  """A centralized run's metrics.csv and TensorBoard, through the release managers of a federated
  run's `MetricSinks`, keyed by step: `release(step, values)` (the loss; the probe's accuracy where
  one ran). A centralized run starts over when rerun: what an interrupted one wrote goes first."""

  def __init__(self, output_dir: str):
    path = os.path.join(output_dir, "metrics.csv")
    if os.path.exists(path):
      os.remove(path)
    shutil.rmtree(os.path.join(output_dir, "tensorboard"), ignore_errors=True)
    self.csv = CSVReleaseManager(path, key_fieldname="step")
    self.tensorboard = tff.program.TensorBoardReleaseManager(os.path.join(output_dir, "tensorboard"))

  def release(self, step: int, values: dict) -> None:
    asyncio.run(self.csv.release(values, key=step))
    asyncio.run(self.tensorboard.release(values, key=step))


class Resources(Observer):
  """resources.csv: each round's wall time (training, evaluation and release) and resident memory
  (this process and the TFF worker; the client-state store's disk use)."""

  def __init__(self, output_dir: str, store):
    self.store = store
    self.release_manager = CSVReleaseManager(os.path.join(output_dir, "resources.csv"),
                                             key_fieldname="round")
    self.start = time.perf_counter()

  def before_round(self, round_num):
    self.start = time.perf_counter()

  def after_round(self, round_num, state, metrics, released):
    seconds = time.perf_counter() - self.start
    own_mb, worker_mb = runtime.resident_memory_mb()
    resources = {"round_seconds": np.float32(seconds), "rss_mb": np.float32(own_mb),
                 "worker_rss_mb": np.float32(worker_mb)}
    if self.store is not None:
      resources["client_states_mb"] = np.float32(self.store.disk_bytes() / 2**20)
    asyncio.run(self.release_manager.release(resources, key=round_num))


def program_state(state: server_step.ServerState, history, average=None) -> dict:
  """What a checkpoint holds: the server state, the released metrics of every round so far (a
  [rounds, len(RELEASED)] float32 array; NaN where a round released no such value) and, with
  --ema_eval, the average of the weights (`WeightAverage`)."""
  out = dict(state.to_program_state(),
             metrics=np.asarray(history, np.float32).reshape(-1, len(RELEASED)))
  if average is not None:
    out["weight_average"] = list(average)
  return out


class WeightAverage(Observer):
  """--ema_eval=beta: an exponential moving average of the server's weights, which the probes read
  (`view`) instead of the weights themselves (De et al., 2022: for DP training). After round t the
  average moves by decay min(beta, (1 + t) / (10 + t)) (the warm-up of TF's and their EMA: early
  rounds do not drag the initialization along). It starts at the initial weights and is
  checkpointed with the state (`program_state`)."""

  def __init__(self, beta: float, weights):
    self.beta, self.weights = beta, [np.array(w) for w in weights]

  def after_round(self, round_num, state, metrics, released):
    decay = min(self.beta, (1.0 + round_num) / (10.0 + round_num))
    self.weights = [(decay * a + (1.0 - decay) * np.asarray(w)).astype(a.dtype)
                    for a, w in zip(self.weights, state.weights)]

  def view(self, state: server_step.ServerState) -> server_step.ServerState:
    """`state` with the average in place of its weights: what the probes evaluate."""
    return dataclasses.replace(state, weights=self.weights)


def weight_average(config, model, state, loaded) -> WeightAverage | None:
  """The run's `WeightAverage` (from a checkpoint's `loaded` program state where it resumes), or
  None without --ema_eval; a one-line ValueError where the process has no one global model."""
  beta = getattr(config, "ema_eval", 0.0)
  if not beta:
    return None
  if len(state.weights) != len(model.names):
    raise ValueError(f"--ema_eval averages one global model's weights; method {config.method!r} "
                     f"keeps its encoders elsewhere: remove --ema_eval")
  return WeightAverage(beta, loaded["weight_average"] if loaded is not None else state.weights)


class Checkpoints(Observer):
  """The program state (`program_state`) every `every` rounds and after the last, through
  `state_manager`; then the client-state store drops the versions no kept checkpoint needs."""

  def __init__(self, state_manager, history: list, store, every: int, rounds: int,
               average: WeightAverage | None = None):
    self.state_manager, self.history, self.store = state_manager, history, store
    self.every, self.rounds, self.average = every, rounds, average

  def after_round(self, round_num, state, metrics, released):
    if state.round_num % self.every == 0 or state.round_num == self.rounds:
      average = self.average.weights if self.average is not None else None
      asyncio.run(self.state_manager.save(program_state(state, self.history, average),
                                          version=state.round_num))
      if self.store is not None:
        self.store.prune(min(asyncio.run(self.state_manager.get_versions()) or [state.round_num]))


class ProgressBar(Observer):
  """The rounds' progress bar (tqdm): the loss, and epsilon with DP."""

  def __init__(self, rounds: int, initial: int, enabled: bool, convention: str = ""):
    self.convention = convention  # How epsilon is stated (`accounting.Convention.label`).
    self.bar = progress_lib.bar(rounds, desc="rounds", unit="round", initial=initial,
                                enabled=enabled)

  def after_round(self, round_num, state, metrics, released):
    self.bar.update(1)
    postfix = {"loss": f"{metrics['loss']:.2f}"}
    if "epsilon" in released:  # Infinite only without noise: the clip-only diagnostic.
      postfix["eps"] = (f"{released['epsilon']:.2f} ({self.convention})"
                        if np.isfinite(released["epsilon"]) else "inf (no noise: not private)")
      if released.get("dp_noise_cohort"):  # A simulated noise cohort's epsilon, so labelled.
        postfix["eps"] += f" (noise simulated for a cohort of {int(released['dp_noise_cohort'])})"
    self.bar.set_postfix(**postfix)

  def close(self):
    self.bar.close()
