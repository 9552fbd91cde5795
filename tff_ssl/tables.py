"""Paper tables as data: rows (methods), columns (client partitions), evaluations, the paper's numbers.

A `Table` is a grid of cells; `tff_ssl.reproduce` runs them and renders `table.md` / `table.csv` /
`curves.png`. Every cell is an `ExperimentConfig` derived from the table, so a cell is also a plain
`bin/train` run. Tables live in `tasks/` at two scales of the same grid (`mini`: CPU, `paper`: GPU).

  Row       a method (`ExperimentConfig` with its method-specific fields); federated rows have one cell
            per column, centralized rows one cell for the whole row, the supervised row one cell per
            label fraction. `learning_rates`: candidates chosen on a validation split held out of the
            training data (pilot runs on the table's selection column), never on the test split.
  Column    a partition of the training split: total clients / samples per client / clients per round,
            Dirichlet alpha (0: one class per client; 1000: IID); and/or other config fields the
            column sets (`overrides`: e.g. the SSL method of the L-DAWA table's columns).
  Evaluation a protocol on the pretrained encoder: linear probe or full fine-tuning on a label fraction.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence, Union

from tff_ssl import evaluation, methods
from tff_ssl.experiment import ExperimentConfig

FAILED = "FAILED"  # The paper's entry for a run that trained unstably.
# Why a cell is not run: the rule and its one-line reason.
WITHIN_CLIENT_NEEDS_TWO = ("within-client loss needs >= 2 samples per client "
                           "(the paper leaves this cell empty for the same reason)")


@dataclasses.dataclass(frozen=True)
class Column:
  """A column of the grid: the partition fields it sets (0 / None: the row's own) and any other
  config fields (`overrides`, pairs of field name and value)."""

  key: str
  group: str  # "non-IID" or "IID"; or any heading shared by neighbouring columns.
  num_clients: int = 0
  samples_per_client: int = 0
  clients_per_round: int = 0
  alpha: float | None = None
  overrides: tuple[tuple[str, Any], ...] = ()
  title: str = ""  # The column's heading (default: clients / samples per client / per round).
  # Fields given in images, each set to value / the row's samples_per_client (a cohort of the same
  # images a round for rows of one-image and of 4-image clients), e.g. (("clients_per_round", 1024),).
  in_images: tuple[tuple[str, int], ...] = ()

  @property
  def label(self) -> str:
    if self.title:
      return self.title
    return f"{self.num_clients:,} / {self.samples_per_client} / {self.clients_per_round}"

  @property
  def global_batch(self) -> int:
    return self.samples_per_client * self.clients_per_round

  @property
  def fields(self) -> dict[str, Any]:
    """The config fields this column sets."""
    fields = {name: getattr(self, name) for name in ("num_clients", "samples_per_client",
                                                     "clients_per_round")
              if getattr(self, name)}
    if self.alpha is not None:
      fields["alpha"] = self.alpha
    return {**fields, **dict(self.overrides)}

  def apply(self, config: ExperimentConfig) -> ExperimentConfig:
    """`config` with this column's fields set (`in_images`: over the row's images a client)."""
    fields = self.fields
    per_client = fields.get("samples_per_client", config.samples_per_client)
    for name, images in self.in_images:
      if images % per_client:
        raise ValueError(f"column {self.key!r}: {name} of {images} images is no whole number of "
                         f"clients of {per_client} images")
      fields[name] = images // per_client
    return dataclasses.replace(config, **fields)


@dataclasses.dataclass(frozen=True)
class Row:
  key: str
  name: str
  config: ExperimentConfig
  learning_rates: tuple[float, ...] = ()  # > 1 candidates: chosen on the validation split.
  # Key of another row whose validation choice this row takes instead of running pilots of its own
  # (centralized CCO takes DCCO's: one round at one sample per client *is* one centralized step).
  select_with: str = ""
  # Rounds (steps) between this row's curve probes, where it differs from the table's `curve_every`
  # (0: the table's), e.g. a row whose probe is dear (FedFoA's heterogeneous cells probe four
  # encoders).
  curve_every: int = 0
  # The columns this row runs in (empty: every column), e.g. a control run only where it is needed.
  columns: tuple[str, ...] = ()
  # Key of a centralized row of the table (one run, no pilots) whose finished run's encoder this
  # federated row's runs and pilots start from (`--init_from`): e.g. pretraining on synthetic
  # images, which touches no private data. `reproduce` runs that row first.
  init_from: str = ""

  @property
  def method(self) -> methods.Method:
    return self.config.method_entry

  @property
  def federated(self) -> bool:
    return self.method.federated

  @property
  def supervised(self) -> bool:
    return self.method.kind == "supervised"

  @property
  def lr_field(self) -> str:
    return self.method.lr_field

  def skip_reason(self, column: Column) -> str | None:
    """Why this row has no result in `column` (None: it runs)."""
    if self.columns and column.key not in self.columns:
      return f"this row runs only in {', '.join(self.columns)}"
    config = column.apply(self.config)
    if (self.federated and config.partition != "dirichlet_split" and
        config.samples_per_client < self.method.min_samples(config)):
      return WITHIN_CLIENT_NEEDS_TWO
    return None


# How a claim compares its rows (`Claim.relation`).
RELATIONS = ("above", "at_least", "within", "by")


@dataclasses.dataclass(frozen=True)
class Claim:
  """A comparison a paper makes about two of a table's rows, checked on our numbers in every column
  it applies to (`table_report.claim_lines`): `better` is above `base` ("above"), at least it
  ("at_least"), within `within` points of it ("within"), or above it by at least `by` points ("by":
  a magnitude the paper states, "+1.58 to +5.52").

  source: where the paper makes it: its table, or the sentence quoted.
  columns: the columns it is checked in (empty: every column where both rows have a cell; a row
    without columns, e.g. a centralized one, is compared in each column of the other).
  evaluations: the evaluations it reads, each must hold (empty: the gate's, the main probe at each
    label seed).
  label: what tells this claim from another between the same rows (e.g. "training seed 1").
  own: the project's claim, not the paper's (counted apart: `table_report.claim_tally`).
  """

  better: str
  base: str
  source: str
  relation: str = "above"
  within: float = 0.0
  by: float = 0.0
  columns: tuple[str, ...] = ()
  evaluations: tuple[str, ...] = ()
  label: str = ""
  own: bool = False

  def __post_init__(self):
    if self.relation not in RELATIONS:
      raise ValueError(f"claim {self.better} vs {self.base}: relation {self.relation!r} is not one "
                       f"of {RELATIONS}")
    if (self.relation == "within") != (self.within > 0):
      raise ValueError(f"claim {self.better} vs {self.base}: 'within' needs within > 0 points, and "
                       f"only 'within' takes it")
    if (self.relation == "by") != (self.by > 0):
      raise ValueError(f"claim {self.better} vs {self.base}: 'by' needs by > 0 points, and only "
                       f"'by' takes it")
    if not self.source:
      raise ValueError(f"claim {self.better} vs {self.base}: name its source in the paper")
    if self.source.startswith("not the paper's") != self.own:
      raise ValueError(f"claim {self.better} vs {self.base}: a claim of the project's own is "
                       f"own=True and its source begins \"not the paper's\"; give both or neither")


# What a table's first evaluation, its main probe, may be: the ordering checks and the gate read it.
MAIN_PROBES = (evaluation.LinearProbeConfig, evaluation.TunedLinearProbeConfig)


@dataclasses.dataclass(frozen=True)
class Evaluation:
  key: str
  name: str
  protocol: Union[evaluation.LinearProbeConfig, evaluation.KNNConfig, evaluation.FineTuneConfig]

  @property
  def label_fraction(self) -> float:
    return self.protocol.label_fraction

  @property
  def label_seed(self) -> int:
    """The seed of the labeled subset the protocol trains on (`evaluation.labeled_subset`)."""
    return getattr(self.protocol, "seed", 0)


# The frozen-feature evaluations of the FedSSL tables (FedEMA, LW-FedSSL, FedFoA) on every training
# label: this project's linear probe (features standardized, LARS) and the FedEMA authors' kNN monitor.
LINEAR_AND_KNN_100 = (
    Evaluation("linear_100", "Linear probe, 100% labels", evaluation.LinearProbeConfig(
        label_fraction=1.0, steps=1000, batch_size=512, optimizer="lars", learning_rate=2.0)),
    Evaluation("knn_100", "kNN monitor (k = 200, t = 0.1), 100% labels", evaluation.KNNConfig(
        label_fraction=1.0, k=200, temperature=0.1)),
)


# The tuned linear probe at 10% of the labels and two label-subset seeds: the main probe of the tables
# rerun in the mini regime, and what their gate reads (issue 31; `table_report.gate`).
TUNED_10_TWO_SEEDS = (
    Evaluation("tuned_10_s0", "Tuned linear probe, 10% labels, label seed 0",
               evaluation.TunedLinearProbeConfig(label_fraction=0.1, seed=0)),
    Evaluation("tuned_10_s1", "Tuned linear probe, 10% labels, label seed 1",
               evaluation.TunedLinearProbeConfig(label_fraction=0.1, seed=1)),
)
TUNED_GATE = tuple(e.key for e in TUNED_10_TWO_SEEDS)
# The same probe at 1% of the labels (DCCO Table 1's second label fraction, the centralized gate's).
TUNED_1_TWO_SEEDS = (
    Evaluation("tuned_1_s0", "Tuned linear probe, 1% labels, label seed 0",
               evaluation.TunedLinearProbeConfig(label_fraction=0.01, seed=0)),
    Evaluation("tuned_1_s1", "Tuned linear probe, 1% labels, label seed 1",
               evaluation.TunedLinearProbeConfig(label_fraction=0.01, seed=1)),
)
# The FedSSL tables' evaluations: the tuned probe (main), then the LARS probe and the FedEMA authors'
# kNN monitor on every label (beside which the papers' numbers stand).
TUNED_LINEAR_AND_KNN_100 = TUNED_10_TWO_SEEDS + LINEAR_AND_KNN_100


@dataclasses.dataclass(frozen=True)
class Table:
  """One paper table at one scale. `paper[(evaluation, row, column)]`: the published number (percent)
  or FAILED; rows without columns use column "". """

  name: str
  scale: str
  title: str
  rows: tuple[Row, ...]
  columns: tuple[Column, ...]
  evaluations: tuple[Evaluation, ...]  # The first is the linear probe the curves and cells report.
  paper: Mapping[tuple[str, str, str], Union[float, str]]
  curve_every: int  # Rounds (steps) between linear probes for curves.png.
  selection_column: str  # Where learning-rate pilots of federated rows run.
  supervised_epochs: float  # Length of the supervised-from-scratch row on each label fraction.
  validation_fraction: float = 0.1
  pilot_fraction: float = 0.25  # Pilot length as a fraction of the row's rounds (steps).
  notes: tuple[str, ...] = ()
  max_rounds: int = 0  # > 0: a capped smoke run of the grid (see `capped`).
  # The paper's claims as checks on our numbers: (table, records of table_report.collect) -> lines.
  checks: Callable[["Table", list], list[str]] | None = None
  # (table, output folder) -> markdown the report adds after the checks (e.g. LW-FedSSL's cost
  # table); the files it writes go in the output folder.
  appendix: Callable[["Table", str], str] | None = None
  column_heading: str = "total clients / samples per client / clients per round"
  # The evaluations the gate reads (`table_report.gate`): the main probe at each label-subset seed;
  # () reads the first evaluation alone.
  gate_evaluations: tuple[str, ...] = ()
  # (table, output folder) -> {(row, column): {evaluation key: {"random_init": fraction}}}: the
  # baselines of cells whose encoder is not the table's (e.g. FedFoA's heterogeneous clients, each
  # architecture at its own initialization), which the gate reads instead of the table's.
  cell_baselines: Callable[["Table", str], dict] | None = None
  # The paper's comparisons of this table's rows, each with its source (`Claim`); the report checks
  # every one of them in every column it applies to.
  claims: tuple[Claim, ...] = ()
  # The training seeds of every cell a claim compares (`claim_cells`); () : each row's own seed
  # alone. With seeds, a claim's verdict is `tff_ssl.verdicts`' rule on the paired differences,
  # with the table's tie margin `tie` (points) and why it is that (`tie_why`, on the page).
  seeds: tuple[int, ...] = ()
  tie: float = 0.0
  tie_why: str = ""

  def __post_init__(self):
    _check(self)

  @property
  def gate_keys(self) -> tuple[str, ...]:
    """The evaluation keys the gate reads: `gate_evaluations`, or the first evaluation alone."""
    return tuple(self.gate_evaluations) or (self.evaluations[0].key,)

  def gate_keys_at(self, label_fraction: float) -> tuple[str, ...]:
    """The gate's probe at `label_fraction`: the evaluations whose protocol is a gate evaluation's
    but for the label fraction and the label seed (the main fraction's: `gate_keys`)."""
    gates = [e for e in self.evaluations if e.key in self.gate_keys]
    if any(e.label_fraction == label_fraction for e in gates):
      return self.gate_keys
    def same_probe(e, g):
      return type(e.protocol) is type(g.protocol) and dataclasses.replace(
          e.protocol, label_fraction=g.label_fraction, **(
              {"seed": g.label_seed} if hasattr(g.protocol, "seed") else {})) == g.protocol
    return tuple(e.key for e in self.evaluations if e.label_fraction == label_fraction
                 and any(same_probe(e, g) for g in gates))

  @property
  def piloted_rows(self) -> tuple[Row, ...]:
    """Rows whose learning rate is chosen by pilot runs of their own."""
    return tuple(r for r in self.rows if len(r.learning_rates) > 1 and not r.select_with)

  def row(self, key: str) -> Row:
    return next(r for r in self.rows if r.key == key)

  def column(self, key: str) -> Column:
    return next(c for c in self.columns if c.key == key)

  @property
  def curve_evaluation(self) -> "Evaluation | None":
    """The LARS linear probe a run makes itself (its curves, its pilots' score): the first
    evaluation, or where the main probe is the tuned one, the first LARS probe of the table."""
    return next((e for e in self.evaluations
                 if isinstance(e.protocol, evaluation.LinearProbeConfig)), None)

  @property
  def in_run_main(self) -> bool:
    """Whether the main probe is the run's own LARS probe (else an evaluation after the run)."""
    return isinstance(self.evaluations[0].protocol, evaluation.LinearProbeConfig)

  def claim_columns(self, claim: Claim) -> list[str]:
    """The columns `claim` is checked in: its own, else every column where neither row is left out
    by rule (a within-client loss at one image a client, a row that runs in some columns only); ""
    alone when neither row has columns."""
    federated = [self.row(k).federated for k in (claim.better, claim.base)]
    if not any(federated):
      return [""]
    out = []
    for key in list(claim.columns) or [c.key for c in self.columns]:
      column = self.column(key)
      if not any(f and self.row(k).skip_reason(column) for k, f in zip((claim.better, claim.base),
                                                                       federated)):
        out.append(key)
    return out

  def claim_cells(self) -> set[tuple[str, str]]:
    """The (row, column) cells some claim compares ("" for a row without columns; the supervised
    row's cells are label subsets, not training runs, and are left out)."""
    out = set()
    for claim in self.claims:
      for column in self.claim_columns(claim):
        for key in (claim.better, claim.base):
          row = self.row(key)
          if not row.supervised:
            out.add((key, column if row.federated else ""))
    return out

  def own_seed(self, row: Row, column: str) -> int:
    """The training seed of `row`'s own cell in `column` ("" for none): its config's, as the column
    leaves it."""
    return (self.column(column).apply(row.config) if column else row.config).seed

  def seeds_of(self, row: Row, column: str) -> tuple[int, ...]:
    """The training seeds the cell of `row` in `column` runs at: its own seed, then the table's
    others where a claim compares the cell."""
    own = self.own_seed(row, column)
    if not self.seeds or (row.key, column) not in self.claim_cells():
      return (own,)
    return (own,) + tuple(s for s in self.seeds if s != own)

  def cell_config(self, row: Row, column: Column | None, learning_rate: float | None = None,
                  seed: int | None = None) -> ExperimentConfig:
    """The run of `row` in `column` (None for rows without columns), at training seed `seed` (None:
    the row's own): its own probe (curves, pilots) is the table's LARS probe, the main one or the
    first LARS one (default settings if none)."""
    curve = self.curve_evaluation
    probe = curve.protocol if curve is not None else evaluation.LinearProbeConfig(
        label_fraction=self.evaluations[0].label_fraction)
    fields = dict(eval_label_fraction=probe.label_fraction, eval_steps=probe.steps,
                  eval_learning_rate=probe.learning_rate,
                  eval_every=row.curve_every or self.curve_every)
    if learning_rate is None and len(row.learning_rates) == 1:
      learning_rate = row.learning_rates[0]
    if learning_rate is not None:
      fields[row.lr_field] = learning_rate
    if seed is not None:
      fields["seed"] = seed
    config = column.apply(row.config) if column is not None else row.config
    return dataclasses.replace(config, **fields)

  def pilot_config(self, row: Row, learning_rate: float, num_pilot_train: int) -> ExperimentConfig:
    """A shortened run of `row` at `learning_rate` on train minus the validation split, scored on it.

    `num_pilot_train`: images left for training once the validation split is held out.
    """
    column = self.column(self.selection_column) if row.federated else None
    config = self.cell_config(row, column, learning_rate)
    length = row.method.length_field
    fields = {length: max(1, math.ceil(self.pilot_fraction * getattr(config, length))),
              "validation_fraction": self.validation_fraction, "eval_every": 0}
    if row.federated:
      fields["num_clients"] = min(config.num_clients, num_pilot_train // config.samples_per_client)
    return dataclasses.replace(config, **fields)

  def supervised_config(self, row: Row, label_fraction: float, num_train: int,
                        label_seed: int = 0) -> ExperimentConfig:
    """The supervised row trained from scratch on `label_fraction` of the labels, the subset of
    `label_seed` (which also seeds its initialization and batches: seed 0 is the row's own seed)."""
    labeled = max(1, round(label_fraction * num_train))
    batch = min(row.config.batch_size, labeled)
    steps = max(1, math.ceil(self.supervised_epochs * labeled / batch))
    if self.max_rounds:
      steps = min(steps, self.max_rounds)
    seed = {"seed": label_seed} if label_seed else {}
    return dataclasses.replace(row.config, eval_label_fraction=label_fraction, steps=steps,
                               batch_size=max(2, batch), **seed)

  def select(self, rows: Sequence[str] | None = None, columns: Sequence[str] | None = None
             ) -> "Table":
    """The same table restricted to `rows` / `columns` (keys, in the table's order; None: all)."""
    return _select(self, rows, columns)

  def with_settings(self, settings: Mapping[str, Any]) -> "Table":
    """The same grid with config fields changed in every run (a variant of the table, e.g. the
    L-DAWA authors' FedAvg warm-up); an error if a row cannot take a setting or a column sets it."""
    return _with_settings(self, settings)

  def variant(self, rows: Sequence[str] | None = None, columns: Sequence[str] | None = None,
              settings: Mapping[str, Any] | None = None) -> "Table":
    """`select(rows, columns)` with `settings` changed in every run, in the order that lets a set
    learning rate stand in for pilots: rows are chosen before the settings (a setting need only
    apply to the chosen rows), columns after (the pilots' column is needed only if pilots run)."""
    return self.select(rows).with_settings(settings or {}).select(columns=columns)

  @property
  def chosen_rows(self) -> tuple[Row, ...]:
    """Rows whose learning rate comes from pilots: their own, or another row's (`select_with`)."""
    return tuple(r for r in self.rows if len(r.learning_rates) > 1)

  def capped(self, max_rounds: int) -> "Table":
    """The same grid with every run, pilot and evaluation cut to at most `max_rounds` rounds/steps
    (and local epochs), a smoke run of the grid, e.g. the paper scale on new hardware."""
    return _capped(self, max_rounds)


def _check(table: "Table") -> None:
  """A table's declaration, checked when made: seeds and tie, rows, columns, claims, probes."""
  if table.seeds and (len(set(table.seeds)) != len(table.seeds) or len(table.seeds) < 2 or
                     min(table.seeds) < 0):
    raise ValueError(f"table {table.name}: seeds must be >= 2 distinct training seeds >= 0; got "
                     f"{table.seeds}")
  if table.seeds and (table.tie < 0 or not table.tie_why):
    raise ValueError(f"table {table.name}: a table with training seeds declares its tie margin "
                     f"(tie >= 0 points) and why (tie_why)")
  keys = [r.key for r in table.rows]
  if len(set(keys)) != len(keys):
    raise ValueError(f"table {table.name}: duplicate row keys {keys}")
  for r in table.rows:
    if r.select_with and (r.select_with not in keys or
                          table.row(r.select_with).learning_rates != r.learning_rates or
                          table.row(r.select_with).select_with):
      raise ValueError(f"table {table.name}: row {r.key!r} selects with {r.select_with!r}, which "
                       f"must be a row of the same candidate learning rates that runs pilots")
  for r in table.rows:
    if r.init_from and not (r.federated and r.init_from in keys and
                            table.row(r.init_from).method.kind == "centralized" and
                            len(table.row(r.init_from).learning_rates) <= 1):
      raise ValueError(f"table {table.name}: row {r.key!r} starts from the encoder of row "
                       f"{r.init_from!r}: it must be federated, and that row a centralized row of "
                       f"the table with one learning rate (it runs before the pilots)")
  for r in table.rows:
    stray = sorted(set(r.columns) - {c.key for c in table.columns})
    if stray:
      raise ValueError(f"table {table.name}: row {r.key!r} names column {stray[0]!r}, which is not "
                       f"one of {[c.key for c in table.columns]}")
  if table.selection_column not in {c.key for c in table.columns}:
    raise ValueError(f"table {table.name}: selection column {table.selection_column!r} is not one "
                     f"of {[c.key for c in table.columns]}")
  unknown = sorted(set(table.gate_evaluations) - {e.key for e in table.evaluations})
  if unknown:
    raise ValueError(f"table {table.name}: gate evaluation {unknown[0]!r} is not an evaluation")
  evaluation_keys = {e.key for e in table.evaluations}
  for c in table.claims:
    stray = sorted({c.better, c.base} - set(keys))
    stray_columns = sorted(set(c.columns) - {x.key for x in table.columns})
    stray_evaluations = sorted(set(c.evaluations) - evaluation_keys)
    if stray or stray_columns or stray_evaluations:
      what = (f"row {stray[0]!r}" if stray else f"column {stray_columns[0]!r}" if stray_columns
              else f"evaluation {stray_evaluations[0]!r}")
      raise ValueError(f"table {table.name}: a claim names {what}, which the table does not have")
  first = table.evaluations[0].protocol
  if not isinstance(first, MAIN_PROBES):
    raise ValueError(f"table {table.name}: the first evaluation must be a linear probe (LARS or "
                     f"tuned); got {type(first).__name__}")


def _select(table: "Table", rows: Sequence[str] | None, columns: Sequence[str] | None
            ) -> "Table":
  """`Table.select`."""
  def keep(kind, wanted, have):
    if wanted is None:
      return have
    unknown = [k for k in wanted if k not in {x.key for x in have}]
    if unknown:
      raise ValueError(f"table {table.name} has no {kind} {unknown[0]!r}; choose from "
                       f"{[x.key for x in have]}")
    return tuple(x for x in have if x.key in wanted)
  kept_rows = keep("row", rows, table.rows)
  kept_columns = keep("column", columns, table.columns)
  column_keys = {c.key for c in kept_columns}
  restricted = []  # Rows that run only in some columns keep those of them that are kept.
  for r in kept_rows:
    if r.columns and not set(r.columns) & column_keys:
      if rows is not None:
        raise ValueError(f"row {r.key!r} runs only in column {', '.join(r.columns)}; select it "
                         f"too")
      continue
    restricted.append(dataclasses.replace(r, columns=tuple(c for c in r.columns
                                                           if c in column_keys)))
  kept_rows = tuple(restricted)
  keys = {r.key for r in kept_rows}
  for r in kept_rows:
    if r.select_with and r.select_with not in keys:
      raise ValueError(f"row {r.key!r} takes its learning rate from row {r.select_with!r}'s "
                       f"pilots; select {r.select_with!r} too")
    if r.init_from and r.init_from not in keys:
      raise ValueError(f"row {r.key!r} starts from the encoder of row {r.init_from!r}; select "
                       f"{r.init_from!r} too")
  # The claims between kept rows, in the kept columns (a claim whose columns are all left out
  # goes too).
  claims = []
  for c in table.claims:
    if c.better in keys and c.base in keys:
      if c.columns and not set(c.columns) & column_keys:
        continue
      claims.append(dataclasses.replace(c, columns=tuple(k for k in c.columns
                                                         if k in column_keys)))
  selection = table.selection_column
  if selection not in {c.key for c in kept_columns}:
    if any(len(r.learning_rates) > 1 and not r.select_with for r in kept_rows):
      raise ValueError(f"the learning-rate pilots run in column {selection!r}; select it too")
    selection = kept_columns[0].key  # No pilots: the selection column is not used.
  return dataclasses.replace(table, rows=kept_rows, columns=kept_columns,
                             selection_column=selection, claims=tuple(claims))


def _with_settings(table: "Table", settings: Mapping[str, Any]) -> "Table":
  """`Table.with_settings`."""
  if not settings:
    return table
  for c in table.columns:
    clash = sorted(set(c.fields) & set(settings))
    if clash:
      raise ValueError(f"column {c.key!r} sets {clash[0]} itself; leave {clash[0]} out of the "
                       f"settings or select other columns")
  # A set learning rate replaces the pilots of the rows it is the learning rate of, and of the
  # rows that would take those rows' choice (centralized CCO DCCO's): the variant runs at it.
  fixed = {r.key: settings[r.lr_field] for r in table.rows if r.lr_field in settings}
  taken = []
  for r in table.rows:
    if r.key not in fixed and r.select_with in fixed:
      fixed[r.key] = fixed[r.select_with]
      leader = table.row(r.select_with)
      taken.append(f"{r.name} takes {leader.name}'s {leader.lr_field}={fixed[r.key]:g} as its "
                   f"{r.lr_field}, as it would take {leader.name}'s pilots' choice.")
  rows = []
  for r in table.rows:
    try:
      row = dataclasses.replace(r, config=dataclasses.replace(r.config, **settings))
    except ValueError as e:
      raise ValueError(f"row {r.key!r}: {e}; select the rows the setting applies to") from None
    if r.key in fixed:
      row = dataclasses.replace(row, learning_rates=(float(fixed[r.key]),), select_with="")
    rows.append(row)
  shown = ", ".join(f"{k}={v}" for k, v in settings.items() if k != "data_dir")
  notes = table.notes + ((f"A variant of the table: {shown} in every run.",) if shown else ())
  return dataclasses.replace(table, rows=tuple(rows), notes=notes + tuple(taken))


def _capped(table: "Table", max_rounds: int) -> "Table":
  """`Table.capped`."""
  lengths = ("rounds", "steps", "local_steps", "checkpoint_every")
  def cap_row(row: Row) -> Row:
    c = row.config
    return dataclasses.replace(row, config=dataclasses.replace(
        c, **{k: min(getattr(c, k), max_rounds) for k in lengths}),
        curve_every=min(row.curve_every, max_rounds))
  def cap_protocol(p):
    if hasattr(p, "steps"):
      return dataclasses.replace(p, steps=min(p.steps, max_rounds))
    if hasattr(p, "max_iterations"):  # The tuned probe's L-BFGS iterations.
      return dataclasses.replace(p, max_iterations=min(p.max_iterations, max_rounds))
    return p  # The kNN monitor trains nothing.
  def cap_column(column: Column) -> Column:  # A column may set a run's length too.
    return dataclasses.replace(column, overrides=tuple(
        (k, min(v, max_rounds) if k in lengths else v) for k, v in column.overrides))
  evals = tuple(dataclasses.replace(e, protocol=cap_protocol(e.protocol))
                for e in table.evaluations)
  return dataclasses.replace(
      table, rows=tuple(cap_row(r) for r in table.rows), evaluations=evals,
      columns=tuple(cap_column(c) for c in table.columns),
      curve_every=min(table.curve_every, max_rounds), max_rounds=max_rounds, notes=table.notes + (
              f"capped at {max_rounds} rounds/steps per run (a smoke run, not a result)",))


def parse_settings(items: Sequence[str]) -> dict[str, Any]:
  """{field: value} from "FIELD=VALUE" strings, each value typed as the `ExperimentConfig` field's
  default (int, float, bool: true/false, str, tuple: comma-separated integers)."""
  defaults = {f.name: f.default for f in dataclasses.fields(ExperimentConfig)}
  out: dict[str, Any] = {}
  for item in items:
    name, sep, text = item.partition("=")
    if not sep or name not in defaults:
      raise ValueError(f"setting {item!r} is not FIELD=VALUE with FIELD one of ExperimentConfig's "
                       f"fields (bin/train --helpfull lists them)")
    default = defaults[name]
    try:
      if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0"):
          raise ValueError
        value = text.lower() in ("true", "1")
      elif isinstance(default, tuple):
        value = tuple(int(x) for x in text.split(",") if x)
      elif default is None or isinstance(default, str):
        value = text
      else:
        value = type(default)(text)
    except ValueError:
      raise ValueError(f"setting {item!r}: {text!r} is not a valid "
                       f"{type(default).__name__} for {name}") from None
    out[name] = value
  return out
