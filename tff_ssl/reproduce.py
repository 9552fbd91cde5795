"""Runs a paper table (`tff_ssl.tables.Table`) cell by cell and writes it beside the paper's numbers.

`reproduce(table, output_dir)` fills `output_dir`:

  selection.json      learning rates chosen on the validation split (pilot runs in selection/)
  cells/ROW/COLUMN/   one `bin/train`-style run folder per cell (hparams, metrics, checkpoints, results);
                      COLUMN_seedS/ the same cell at another training seed S (`Table.seeds`)
  random_init.json    the baselines: raw pixels and the encoder at its initialization under each
                      frozen-feature evaluation (the primary one's random init is the curves' round 0)
  table.md, table.csv our numbers beside the paper's; curves.png: linear-probe accuracy over rounds
  timing.json         seconds per cell (a cell run in interrupted parts: their sum) and per
                      invocation of the whole table

Resumable: a cell whose results.json (or failed.json) exists is skipped; an interrupted federated cell
resumes from its latest checkpoint (a centralized cell restarts). A run whose loss diverges is recorded
as failed (the paper's FAILED) rather than stopping the table.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Sequence

import tensorflow as tf

from tff_ssl import evaluation, experiment, rundir, runner, table_report
from tff_ssl import progress as progress_lib
from tff_ssl.tables import FAILED, Column, Row, Table


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the table: a row in a column (federated), the whole row, or a label fraction."""

  row: Row
  column: Column | None = None
  label_fraction: float | None = None  # The supervised row's cells: a label subset,
  label_seed: int = 0  # and its seed.
  seed: int | None = None  # A training seed other than the row's own (`Table.seeds_of`).

  @property
  def path(self) -> str:
    if self.column is not None:
      part = self.column.key
    elif self.label_fraction is not None:
      part = f"labels_{self.label_fraction:g}" + (f"_seed{self.label_seed}" if self.label_seed
                                                   else "")
    else:
      part = "all"
    if self.seed is not None:
      part += f"_seed{self.seed}"
    return os.path.join("cells", self.row.key, part)

  @property
  def training_seed(self) -> int:
    if self.seed is not None:
      return self.seed
    return (self.column.apply(self.row.config) if self.column is not None else self.row.config).seed


def cells(table: Table) -> tuple[list[Cell], dict[tuple[str, str], str]]:
  """The cells to run, and (row, column) -> reason for the cells that are not run. The cells at
  further training seeds (`Table.seeds_of`) come after every row's own."""
  todo, skipped = [], {}
  for row in table.rows:
    if row.supervised:
      subsets = sorted({(e.label_fraction, e.label_seed) for e in table.evaluations},
                       key=lambda s: (-s[0], s[1]))
      for fraction, seed in subsets:
        todo.append(Cell(row, label_fraction=fraction, label_seed=seed))
    elif row.federated:
      for column in table.columns:
        reason = row.skip_reason(column)
        if reason:
          skipped[(row.key, column.key)] = reason
        else:
          todo.append(Cell(row, column))
    else:
      todo.append(Cell(row))
  todo += [Cell(c.row, c.column, seed=s) for c in list(todo) if not c.row.supervised
           for s in table.seeds_of(c.row, c.column.key if c.column else "")[1:]]
  return todo, skipped


def with_init(table: Table, row: Row, config, output_dir: str):
  """`config` of `row` (a cell's or a pilot's) starting from the encoder of the run it names
  (`Row.init_from`: that row's own cell in `output_dir`), else unchanged."""
  if not row.init_from:
    return config
  return dataclasses.replace(config, init_from=os.path.join(
      output_dir, Cell(table.row(row.init_from)).path))


def run_init_rows(table: Table, output_dir: str, timing: dict[str, Any], progress: bool,
                  log: Callable[[str], None]) -> None:
  """The rows other rows start from (`Row.init_from`), run first (before the pilots) where not
  finished: the same runs the cell loop would make, which then finds them done."""
  for key in dict.fromkeys(r.init_from for r in table.rows if r.init_from):
    cell = Cell(table.row(key))
    config = table.cell_config(cell.row, None)
    result, ran = _timed_run(config, output_dir, cell.path, timing, progress=progress,
                             random_init_baseline=False, evaluate=_evaluations(table, config))
    if ran:
      log(f"{cell.path}: {_summary(result)} ({timing['runs'][cell.path]:.0f} s; the start of "
          f"{[r.key for r in table.rows if r.init_from == key]})")


def _read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, value: Any) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rundir.write_atomic(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def _run_or_fail(config, run_dir: str, **kwargs) -> dict[str, Any]:
  """results.json of the run in `run_dir` (running it unless finished), or {"failed": reason}."""
  done, failed = os.path.join(run_dir, "results.json"), os.path.join(run_dir, "failed.json")
  for path in (done, failed):
    if os.path.exists(path):
      hparams = os.path.join(run_dir, "hparams.json")
      if not os.path.exists(hparams) or not rundir.same_settings(hparams, config):
        raise ValueError(f"{run_dir} was run with other settings than the table's now; delete it "
                         f"(or choose another --output_dir) to run it again")
      return _read_json(path)
  try:
    return experiment.run(config, run_dir, **kwargs)
  except FloatingPointError as e:  # A diverged run is a result (the paper's FAILED), not a crash.
    result = {"failed": str(e)}
    if not os.path.exists(os.path.join(run_dir, "hparams.json")):
      with rundir.session():
        rundir.write_hparams(config, run_dir)
    _write_json(failed, result)
    return result


def _evaluations(table: Table, config) -> Callable:
  """The table's evaluations other than the one the cell's run makes itself (its LARS probe, where
  that is the main probe)."""
  after = table.evaluations[1:] if table.in_run_main else table.evaluations

  def evaluate(encoder, train, test) -> dict[str, float]:
    return {e.key: evaluation.evaluate(encoder, train, test, e.protocol) for e in after}
  return evaluate


def _score(result: dict[str, Any]) -> float:
  return -1.0 if "failed" in result else float(result["linear_probe_accuracy_pretrained"])


class _Plan:
  """Counts the runs ahead for the grid-wide progress bar."""

  def __init__(self, table: Table, todo: list[Cell]):
    self.pilots = [(row, lr) for row in table.piloted_rows for lr in row.learning_rates]
    self.total = len(self.pilots) + len(todo) + 1  # + the random-init probe.


def _timed_run(config, output_dir: str, path: str, timing: dict[str, Any], **kwargs
               ) -> tuple[dict[str, Any], bool]:
  """`_run_or_fail` of the run folder `output_dir/path` and whether it ran now (not finished
  before); the wall time of a run goes to timing.json. A run interrupted (Ctrl-C, SIGTERM: a
  session's end) leaves its time so far in timing.json's "interrupted"; the run that resumes it adds
  that in, so that a cell run in parts reports the sum of its parts. A cell whose folder is gone
  starts over, and so does its time."""
  run_dir = os.path.join(output_dir, path)
  finished = any(os.path.exists(os.path.join(run_dir, f)) for f in ("results.json", "failed.json"))
  timing_path = os.path.join(output_dir, "timing.json")
  before = 0.0 if not os.path.isdir(run_dir) else timing.get("interrupted", {}).get(path, 0.0)
  start = time.perf_counter()
  try:
    result = _run_or_fail(config, run_dir, **kwargs)
  except (KeyboardInterrupt, SystemExit):
    if not finished:
      timing.setdefault("interrupted", {})[path] = round(before + time.perf_counter() - start, 1)
      _write_json(timing_path, timing)
    raise
  if not finished:
    timing["runs"][path] = round(before + time.perf_counter() - start, 1)
    timing.get("interrupted", {}).pop(path, None)
    if not timing.get("interrupted", True):
      del timing["interrupted"]
    _write_json(timing_path, timing)
  return result, not finished


# Candidates a row's pilots add beyond its grid's edge, one at a time, while the best is at the edge.
MAX_BEYOND_EDGE = 2


def next_candidate(candidates, edge: float) -> float:
  """The candidate beyond `edge`, the largest or smallest of `candidates`: the next value of the
  1-2-5 series where the candidates are on it (0.005 -> 0.01, 0.0005 -> 0.0002), else one more step
  of the ratio between the edge and its neighbour."""
  values = sorted(set(candidates))
  up = edge == values[-1]
  exponent = math.floor(math.log10(edge) + 1e-9)
  mantissas = {round(v / 10 ** math.floor(math.log10(v) + 1e-9), 6) for v in values}
  if len(values) > 1 and mantissas <= {1.0, 2.0, 5.0}:
    series = [m * 10.0 ** e for e in range(exponent - 2, exponent + 3) for m in (1, 2, 5)]
    above = [v for v in series if v > edge * (1 + 1e-9)]
    below = [v for v in series if v < edge * (1 - 1e-9)]
    return float(f"{(above[0] if up else below[-1]):.6g}")
  if len(values) == 1:
    return edge * (2.0 if up else 0.5)
  ratio = values[-1] / values[-2] if up else values[0] / values[1]
  return float(f"{edge * ratio:.6g}")


def select_learning_rates(table: Table, output_dir: str, bar, progress: bool,
                          timing: dict[str, Any]) -> dict[str, Any]:
  """Pilot runs of every row with several candidate learning rates; the best on validation wins.

  A row with `select_with` takes the other row's choice.
  """
  path = os.path.join(output_dir, "selection.json")
  choices: dict[str, Any] = _read_json(path) if os.path.exists(path) else {}
  rows = table.piloted_rows
  if not rows:
    return choices
  pilot_train, _ = experiment.load_splits(dataclasses.replace(
      rows[0].config, validation_fraction=table.validation_fraction))
  for row in rows:
    scores = {}
    candidates = list(row.learning_rates)
    beyond_edge = 0
    i = 0
    while i < len(candidates):
      lr = candidates[i]
      bar.set_description(f"selection {row.key} lr={lr:g}")
      config = with_init(table, row, table.pilot_config(row, lr, len(pilot_train)), output_dir)
      result, _ = _timed_run(config, output_dir, os.path.join("selection", row.key, f"lr_{lr:g}"),
                             timing, progress=progress, random_init_baseline=False)
      scores[f"{lr:g}"] = _score(result)
      bar.update(1)
      i += 1
      if i == len(candidates) and beyond_edge < MAX_BEYOND_EDGE:
        # A pick at the grid's edge (issue 72): the next candidate beyond it is tried too.
        best = max(candidates, key=lambda lr: scores[f"{lr:g}"])
        if scores[f"{best:g}"] >= 0 and best in (min(candidates), max(candidates)):
          candidates.append(next_candidate(candidates, best))
          beyond_edge += 1
    best = max(candidates, key=lambda lr: scores[f"{lr:g}"])  # Ties: the first tried.
    choices[row.key] = {
        "learning_rate": best, "field": row.lr_field, "validation_linear_probe": scores,
        "pilot_length": getattr(config, "rounds" if row.federated else "steps"),
        "column": table.selection_column if row.federated else None,
        "validation_fraction": table.validation_fraction,
        "at_edge": best in (min(candidates), max(candidates))}
    _write_json(path, choices)
  for row in table.rows:
    if row.select_with:
      choices[row.key] = {**choices[row.select_with], "field": row.lr_field,
                          "selected_with": row.select_with}
  _write_json(path, choices)
  return choices


# The fields that make an encoder's architecture and so its initialization (`build_encoder`).
ENCODER_FIELDS = ("encoder", "width", "stem_stride", "pool_grid", "depth", "patch_size", "readout")
# random_init.json's layout: baselines keyed by what they were measured on (`baseline_keys`).
BASELINES_VERSION = 2


def encoder_key(config) -> str:
  """The architecture of `config`'s encoder, as a key ("vit_mini width=2.0 ..."); a ResNet of plain
  convolutions (`--noweight_standardization`) adds "weight_standardization=False"."""
  parts = [config.encoder] + [f"{f}={getattr(config, f)}" for f in ENCODER_FIELDS[1:]]
  return " ".join(parts + ([] if config.weight_standardization else
                           ["weight_standardization=False"]))


def baseline_keys(config, protocol, image_shape) -> tuple[str, str]:
  """(raw-pixel key, random-init key): what a cell's baselines under `protocol` depend on. Raw
  pixels: the dataset (a shifted testbed is its own dataset), the images' size, the probe with its
  label fraction and label seed; random init: those, the encoder's architecture and the seed it is
  initialized from."""
  data = f"{config.dataset} {'x'.join(str(d) for d in image_shape)} | {protocol!r}"
  return data, f"{data} | {encoder_key(config)} seed={config.seed}"


def cell_baselines(table: Table, output_dir: str, todo,
                   log: Callable[[str], None] = lambda s: None) -> dict:
  """What every pretrained cell must beat, under each frozen-feature evaluation (linear probes,
  kNN): {(row, column or ""): {evaluation key: {"raw_pixels": acc, "random_init": acc}}}, measured
  on the cell's own data and encoder (`baseline_keys`): a column or row that changes the dataset,
  the images, the architecture or the seed gets its own. Each is computed once per output folder
  and kept in random_init.json under its key; a file of an older layout (baselines keyed by
  evaluation alone, which could belong to another dataset) is recomputed."""
  path = os.path.join(output_dir, "random_init.json")
  stored = _read_json(path) if os.path.exists(path) else {}
  if stored and stored.get("version") != BASELINES_VERSION:
    log(f"{path}: baselines of an older layout, not keyed by the dataset and encoder they were "
        f"measured on; measuring them again")
    stored = {}
  stored["version"] = BASELINES_VERSION
  raw, rnd = stored.setdefault("raw_pixels", {}), stored.setdefault("random_init", {})
  evaluations = [e for e in table.evaluations
                 if isinstance(e.protocol, evaluation.FROZEN_FEATURE_PROTOCOLS)]
  splits: dict[tuple, Any] = {}
  out: dict = {}
  for cell in todo:
    if cell.row.supervised or cell.seed is not None:  # The gate reads each row's own seed.
      continue
    # The data its probes read (a centralized row may pretrain on other images: --probe_dataset).
    config = experiment.probe_config_of(table.cell_config(cell.row, cell.column))
    data = (config.dataset, config.data_dir)
    if data not in splits:
      splits[data] = experiment.load_splits(dataclasses.replace(config, validation_fraction=0.0))
    train, test = splits[data]
    encoder = None
    found = out.setdefault((cell.row.key, cell.column.key if cell.column is not None else ""), {})
    for e in evaluations:
      raw_key, init_key = baseline_keys(config, e.protocol, train.image_shape)
      if raw_key not in raw:
        raw[raw_key] = evaluation.evaluate(evaluation.raw_pixels(train.image_shape), train, test,
                                           e.protocol)
        _write_json(path, stored)
      if init_key not in rnd:
        if encoder is None:
          tf.keras.utils.set_random_seed(config.seed)
          encoder = config.build_encoder(train.image_shape)
        rnd[init_key] = evaluation.evaluate(encoder, train, test, e.protocol)
        _write_json(path, stored)
      found[e.key] = {"raw_pixels": raw[raw_key], "random_init": rnd[init_key]}
  first = next((out[k] for k in out), {})
  if stored.get("baselines") != first:  # The first cell's, for readers of the table's baselines.
    stored["baselines"] = first
    _write_json(path, stored)
  return out


def table_baselines(table: Table, per_cell: dict) -> dict[str, dict[str, float]]:
  """The baselines of the table's first pretrained cell, {evaluation: {"raw_pixels", "random_init"}}:
  those of every cell where no column or row changes them (`cell_baselines`)."""
  return next(iter(per_cell.values()), {})


def _finished(output_dir: str, path: str) -> dict[str, Any] | None:
  """results.json (or failed.json) of the run folder `output_dir/path`, None if it has neither."""
  for name in ("results.json", "failed.json"):
    found = os.path.join(output_dir, path, name)
    if os.path.exists(found):
      return _read_json(found)
  return None


def check_workers(table: Table, workers: Sequence[str]) -> None:
  """Raises ValueError (one line, naming the cell) if a federated cell of `table` would leave one of
  `workers` without clients (`runner.check_workers`), before anything runs."""
  if len(workers) < 2:
    return
  todo, _ = cells(table)
  for cell in todo:
    if cell.row.federated:
      config = table.cell_config(cell.row, cell.column)
      try:
        runner.check_workers(config, list(workers))
      except ValueError as e:
        raise ValueError(f"cell {cell.row.key}/{cell.column.key}: " +
                         str(e).replace("set --group_size=", "set --set=group_size=")) from None


def reproduce(table: Table, output_dir: str, *, progress: bool = True,
              log: Callable[[str], None] = lambda s: None,
              render_only: bool = False) -> dict[str, Any]:
  """Runs every cell of `table` not yet finished in `output_dir`; writes the table; returns results.

  `render_only`: runs nothing (no pilot, no cell) and records no invocation: the report of the cells
  finished so far and the choices in selection.json; only missing baselines are measured."""
  start = time.perf_counter()
  todo, skipped = cells(table)
  plan = _Plan(table, todo)
  # The data must be there before anything is written (DataUnavailableError says how to get it).
  experiment.load_splits(table.rows[0].config)
  os.makedirs(output_dir, exist_ok=True)
  timing_path = os.path.join(output_dir, "timing.json")
  timing = _read_json(timing_path) if os.path.exists(timing_path) else {}
  timing.setdefault("runs", {}).update(timing.pop("cells", {}))
  timing.setdefault("invocations", [])
  results: dict[str, dict[str, Any]] = {}
  try:
    with progress_lib.bar(plan.total, desc="table", unit="run", enabled=progress) as bar:
      # A row whose rate a variant fixed takes no choice, not even one an earlier run left here.
      chosen = {r.key for r in table.chosen_rows}
      selection = os.path.join(output_dir, "selection.json")
      if render_only:
        found = _read_json(selection) if os.path.exists(selection) else {}
        for row in table.rows:  # A row that takes another's choice, as the pilots would give it.
          if row.select_with in found:
            found[row.key] = {**found[row.select_with], "field": row.lr_field,
                              "selected_with": row.select_with}
      else:
        run_init_rows(table, output_dir, timing, progress, log)
        found = select_learning_rates(table, output_dir, bar, progress, timing)
      choices = {k: v for k, v in found.items() if k in chosen}
      bar.set_description("random init")
      own = cell_baselines(table, output_dir, todo, log)
      base = table_baselines(table, own)
      # The runs' own LARS probe: the curves' round 0.
      curve = table.curve_evaluation
      random_acc = base[curve.key]["random_init"] if curve is not None else None
      bar.update(1)
      num_train = None
      for cell in todo:
        bar.set_description(cell.path.removeprefix("cells/"))
        if render_only:
          result = _finished(output_dir, cell.path)
          if result is not None:
            results[cell.path] = result
          bar.update(1)
          continue
        if cell.row.supervised:
          if num_train is None:
            num_train = len(experiment.load_splits(cell.row.config)[0])
          config = table.supervised_config(cell.row, cell.label_fraction, num_train,
                                           cell.label_seed)
          kwargs = {}
        else:
          lr = choices.get(cell.row.key, {}).get("learning_rate")
          config = with_init(table, cell.row, table.cell_config(cell.row, cell.column, lr, cell.seed),
                             output_dir)
          kwargs = dict(random_init_baseline=False, evaluate=_evaluations(table, config))
        results[cell.path], ran = _timed_run(config, output_dir, cell.path, timing,
                                             progress=progress, **kwargs)
        if ran:
          log(f"{cell.path}: {_summary(results[cell.path])} ({timing['runs'][cell.path]:.0f} s)")
        tf.keras.backend.clear_session()
        bar.update(1)
    appendix = table.appendix(table, output_dir) if table.appendix else ""
    # A table's own baselines of some cells (FedFoA's heterogeneous clients) replace the measured.
    for cell, evals in (table.cell_baselines(table, output_dir) if table.cell_baselines
                        else {}).items():
      for k, b in evals.items():
        own.setdefault(cell, {}).setdefault(k, {}).update(b)
  except (KeyboardInterrupt, SystemExit):  # Ctrl-C, SIGTERM: the time spent counts all the same.
    if not render_only:
      _record_invocation(timing, timing_path, start)
    raise
  if not render_only:
    _record_invocation(timing, timing_path, start)
  return table_report.write(table, output_dir, todo, skipped, results, choices, random_acc, timing,
                            base, appendix, own)


def _record_invocation(timing: dict[str, Any], path: str, start: float) -> None:
  """Appends this invocation's wall time to timing.json: a resumed table has several, and one that
  takes longer than a session runs in interrupted parts; table.md reports their sum."""
  timing["invocations"].append(round(time.perf_counter() - start, 1))
  _write_json(path, timing)


def _summary(result: dict[str, Any]) -> str:
  if "failed" in result:
    return f"{FAILED}: {result['failed']}"
  if "supervised_accuracy" in result:
    return f"supervised {result['supervised_accuracy']:.4f}"
  return f"linear probe {result['linear_probe_accuracy_pretrained']:.4f}"
