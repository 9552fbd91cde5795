"""DP levers table (issue 74): the levers the DP literature uses, each measured, toward a private
federated encoder above raw pixels.

`bin/reproduce --table=privacy_levers --scale=mini` (2 CPU cores; the cells in `RUN_ORDER` first).

The DP scaling table (`tasks/privacy_scaling_table.py`) states epsilon by RDP with fixed-size
sampling and replace-one neighbours, clips DP-DCCO's statistics adaptively and starts from random
weights; no DP cell passes its gate. This table runs the same users with the levers the DP
literature uses:
  accounting     Poisson sampling, add/remove neighbours, PLD (`--client_sampling=poisson
                 --dp_accountant=pld`): the convention of DP-SGD's and ViP's results. At K = 4,096 of
                 60,000 one-image users over 200 rounds it states epsilon = 8 at z = 1.27 where the
                 scaling table's convention needs z = 4.10 (docs/privacy.md, "Accounting").
  unit           unit-norm projections (`--projector_output=unit`) and DP-DCCO's statistics clip
                 fixed at their bound (`--dp_statistics_clip_at_bound`: sqrt(5) for CCO, sqrt(20)
                 for VICReg), chosen without data, so it never clips and spends no noise on a
                 clipped count.
  multiplicity   M view pairs of each user's image averaged before clipping
                 (`--dp_augmentations=M`, De et al., 2022): the clip still bounds each release.
  EMA            the probes read an exponential moving average of the server weights
                 (`--ema_eval=0.999`, De et al.'s decay with its warm-up).
  synthetic      every encoder starts from centralized CCO on dead leaves (`synthetic_leaves`, no
                 Fashion-MNIST image): the `synthetic` row, whose own probe on the task's images
                 (`--probe_dataset`) is the "synthetic init" baseline.

Rows: DP-DCCO (CCO), DP-DCCO (VICReg), both over one-image users (every training image its own
  user: user-level DP is example-level DP), and DP-FedAvg (SimCLR) over users of 4 images of one
  class (the same images a round), each from random init and from synthetic init (`_synth`), with
  the levers but synthetic init and multiplicity on (M = 1: M view pairs cost M times a cell's
  budget); the `synthetic` row (centralized, no private image) they start from.
Columns: the cohort K in one-image users a round (FedAvg: K / 4 users of 4 images) at epsilon = 8
  and 2 by PLD with Poisson sampling and add/remove neighbours, delta = 1 / 60,000, and without DP
  at the largest K. The ablation (`ABLATION`, DP-DCCO (CCO) at K = 4,096, epsilon = 8): the scaling
  table's cell, then the levers added one at a time: accounting, unit, EMA (the grid's cell),
  synthetic init (the grid's `_synth` cell), M = 2 view pairs (over the budget: 66 minutes of
  rounds).
Rounds: per cohort to fit `CELL_MINUTES` a cell on 2 AVX-512 cores (`MINI_ROUNDS`, from measured
  round times); each DP cell's noise multiplier is calibrated to its epsilon for its own rounds.

  mini   the mini regime (docs/mini_regime.md): ResNet-14 (stride-2 stem, 2 x 2 grid pooling), crops
         >= 50%, 512-wide projector, server Adam 5e-3; main probe: the tuned probe at 10% of the
         labels, two label seeds, and the gate.
"""

from __future__ import annotations

import dataclasses
import math
import os

from tasks import privacy_scaling_table as scaling
from tasks import privacy_table
from tff_ssl import table_report
from tff_ssl import privacy as privacy_lib
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.tables import TUNED_10_TWO_SEEDS, TUNED_GATE, Claim, Column, Row, Table

NAME = "privacy_levers"
TITLE = "DP levers: accounting, unit projections, multiplicity, EMA, synthetic init (delta = 1 / population)"

MINI_DATASET = "fashion_mnist_shifted"
POPULATION = 60_000
CELL_MINUTES = 60
# Rounds of each mini cohort (one view pair a user), to fit CELL_MINUTES a cell on 2 cores of an
# AMD EPYC with AVX-512: K = 4,096's from ROUND_SECONDS; K = 1,024's are the scaling table's (its
# round 2.35 s there; not measured yet with these levers).
MINI_ROUNDS = {1024: 900, 4096: 200}
# Seconds a DP-DCCO (CCO) round of one-image users costs with every lever, by (K, M view pairs), on
# 2 cores of an AMD EPYC with AVX-512 (resources.csv of 6-round runs, the median of rounds 2-5;
# round 0 traces, 52-55 s; 2026-12-07): 200 rounds at K = 4,096 are 36 minutes at M = 1 and 66 at
# M = 2, before the probes.
ROUND_SECONDS = {(4096, 1): 10.8, (4096, 2): 19.8}
# The levers' settings.
# --dp_augmentations of the grid's DP cells: one view pair, as M view pairs cost M times the
# encoder's work (ROUND_SECONDS) and the cells' budget holds one.
MULTIPLICITY = 1
# ... and of the ablation's last step, which adds it (over the budget: ROUND_SECONDS).
ABLATION_MULTIPLICITY = 2
EMA_DECAY = 0.999  # --ema_eval: De et al. (2022)'s decay; its warm-up min(beta, (1 + t) / (10 + t)).
# The synthetic row: centralized CCO on dead leaves, as the DCCO mini table's centralized CCO
# (batch 128, Adam 5e-3, lambda = 2, crops >= 50%, 2 x 2 grid pooling) for 3,000 steps.
SYNTHETIC_STEPS = 3000

# DP-DCCO's statistics clip of the scaling table (ABLATION's first steps, linear projections): its
# adaptive clip at the 0.9 quantile with rate 1.0, from the pilots' median norm.
SCALING_STATISTICS = {"dp_statistics_clip": scaling.PILOT_NORMS["dcco_cco"]["dp_statistics_clip"],
                      "dp_statistics_quantile": scaling.STATISTICS_QUANTILE,
                      "dp_statistics_clip_rate": scaling.STATISTICS_CLIP_RATE,
                      "dp_statistics_clip_at_bound": False, "projector_output": "linear"}
FIELD_CONVENTION = {"client_sampling": "poisson", "dp_accountant": "pld"}
SCALING_CONVENTION = {"client_sampling": "fixed", "dp_accountant": "rdp"}

# The ablation at K = 4,096, epsilon = 8: (row, column, the lever the step adds, its title), each
# step keeping the ones before it. The steps in "abl_" columns are cells of their own; the others
# are the grid's.
ABLATION_K = 4096
ABLATION = (
    ("dcco_cco", "abl_scaling", "", "as the DP scaling table (RDP, fixed-size sampling, replace-one)"),
    ("dcco_cco", "abl_pld", "accounting", "+ Poisson sampling, add/remove, PLD"),
    ("dcco_cco", "abl_unit", "unit", "+ unit projections, statistics clip at the bound"),
    ("dcco_cco", f"k{ABLATION_K}", "EMA", f"+ EMA of the weights ({EMA_DECAY:g})"),
    ("dcco_cco_synth", f"k{ABLATION_K}", "synthetic", "+ synthetic init"),
    ("dcco_cco_synth", "abl_multiplicity", "multiplicity",
     f"+ M = {ABLATION_MULTIPLICITY} view pairs a user"),
)


# The ablation's own columns' headings.
SHORT = {"abl_scaling": "as the scaling table", "abl_pld": "+ PLD", "abl_unit": "+ unit",
         "abl_multiplicity": f"+ synthetic init, M = {ABLATION_MULTIPLICITY}"}


def _ablation_columns() -> tuple[Column, ...]:
  """The ablation's own cells: the grid's DP cell at K = 4,096, epsilon = 8 with the levers not yet
  added taken back (or, the last step, one more added)."""
  without = {"abl_scaling": {**SCALING_CONVENTION, **SCALING_STATISTICS, "ema_eval": 0.0},
             "abl_pld": {**SCALING_STATISTICS, "ema_eval": 0.0},
             "abl_unit": {"ema_eval": 0.0},
             "abl_multiplicity": {"dp_augmentations": ABLATION_MULTIPLICITY}}
  columns = []
  for _, key, _, title in ABLATION:
    if key in without:
      overrides = dict(without[key], rounds=MINI_ROUNDS[ABLATION_K], dp="gaussian_adaptive",
                       dp_target_epsilon=8.0)
      columns.append(Column(key, f"ablation, ε = 8, K = {ABLATION_K:,}", title=SHORT[key],
                            overrides=tuple(sorted(overrides.items())),
                            in_images=(("clients_per_round", ABLATION_K),)))
  return tuple(columns)


def ablation_of(row: str) -> tuple[str, ...]:
  """The ablation's own columns that `row` runs."""
  return tuple(c for r, c, _, _ in ABLATION if r == row and c.startswith("abl_"))


# A column without DP: the DP fields back at their defaults (each is refused without --dp).
NO_DP = (("dp", "off"), ("dp_target_epsilon", 0.0), ("dp_accountant", "rdp"),
         ("dp_augmentations", 1), ("dp_statistics_clip_at_bound", False))


def _columns(rounds: dict[int, int]) -> tuple[Column, ...]:
  cols = []
  for eps in (8.0, 2.0):
    for k in sorted(rounds):
      cols.append(Column(f"k{k}" + ("" if eps == 8.0 else f"_eps{eps:g}"), f"ε = {eps:g}",
                         title=f"K = {k:,}",
                         overrides=(("rounds", rounds[k]), ("dp", "gaussian_adaptive"),
                                    ("dp_target_epsilon", eps)),
                         in_images=(("clients_per_round", k),)))
  best = max(rounds)
  cols.append(Column(f"k{best}_nodp", "no DP", title=f"K = {best:,}", overrides=(
      ("rounds", rounds[best]), *NO_DP), in_images=(("clients_per_round", best),)))
  return tuple(cols)


def epsilon_of(column: Column) -> float:
  """The column's target epsilon (inf without DP)."""
  fields = dict(column.overrides)
  return math.inf if fields.get("dp") == "off" else fields.get("dp_target_epsilon", math.inf)


def _rows(base: ExperimentConfig, grid: tuple[str, ...]) -> tuple[Row, ...]:
  # Every lever on, at epsilon = 8 (each column sets its own privacy).
  levers = dict(FIELD_CONVENTION, ema_eval=EMA_DECAY, dp_augmentations=MULTIPLICITY,
                dp="gaussian_adaptive", dp_target_epsilon=8.0)
  dcco = dataclasses.replace(
      base, method="dcco", partition="per_image", num_clients=POPULATION, samples_per_client=1,
      local_steps=1, client_optimizer="sgd", client_learning_rate=1.0, projector_output="unit",
      dp_statistics_clip_at_bound=True, dp_statistics_clip_rate=0.0, **levers)
  fedavg = dataclasses.replace(
      base, method="fedavg", ssl="simclr", partition="dirichlet", alpha=0.0,
      num_clients=POPULATION // 4, samples_per_client=4, local_steps=1, client_optimizer="sgd",
      client_learning_rate=1.0, projector=(128, 128, 64), temperature=0.1, **levers)
  clips = scaling.PILOT_NORMS
  synthetic = dataclasses.replace(
      base, method="centralized", ssl="cco", dataset="synthetic_leaves",
      probe_dataset=base.dataset, steps=SYNTHETIC_STEPS, batch_size=128, optimizer="adam",
      learning_rate=5e-3)
  rows = [Row("synthetic", "Synthetic init (centralized CCO on dead leaves)",
              synthetic)]
  for key, name, config in (
      ("dcco_cco", "DP-DCCO (CCO)", dataclasses.replace(dcco, ssl="cco",
                                                        dp_clip=clips["dcco_cco"]["dp_clip"])),
      ("dcco_vicreg", "DP-DCCO (VICReg)", dataclasses.replace(
          dcco, ssl="vicreg", dp_clip=clips["dcco_vicreg"]["dp_clip"])),
      ("fedavg_simclr", "DP-FedAvg (SimCLR, users of 4 images)", dataclasses.replace(
          fedavg, dp_clip=clips["fedavg_simclr"]["dp_clip"]))):
    rows.append(Row(key, name, config, columns=grid + ablation_of(key)))
    rows.append(Row(f"{key}_synth", f"{name}, synthetic init", config,
                    columns=grid + ablation_of(f"{key}_synth"), init_from="synthetic"))
  return tuple(rows)


def claims(rows, columns) -> tuple[Claim, ...]:
  """The issue's goal and each lever's worth, as the project's own claims (no paper makes them)."""
  keys = {r.key for r in rows}
  eps8 = tuple(c.key for c in columns if epsilon_of(c) == 8.0 and not c.key.startswith("abl_"))
  out = []
  for key in ("dcco_cco", "dcco_vicreg", "fedavg_simclr"):
    synth = f"{key}_synth"
    if {synth, "synthetic"} <= keys:
      out.append(Claim(synth, "synthetic", "not the paper's: issue 74's goal, a DP cell at ε = 8 "
                       "at least 3 points above the synthetic init it starts from",
                       relation="by", by=3.0, columns=eps8, own=True))
    if {synth, key} <= keys:
      out.append(Claim(synth, key, "not the paper's: issue 74, synthetic init is worth points "
                       "over random init under the same privacy", own=True))
  for dcco in ("dcco_cco", "dcco_vicreg"):
    for suffix in ("", "_synth"):
      if {dcco + suffix, "fedavg_simclr" + suffix} <= keys:
        out.append(Claim(dcco + suffix, "fedavg_simclr" + suffix,
                         "not the paper's: " + scaling.HOME_GROUND, own=True))
  return tuple(out)


# -- the report ---------------------------------------------------------------------------------------

def _mean(results: dict, keys) -> float | None:
  got = [results.get("evaluations", {}).get(k) for k in keys]
  return sum(got) / len(got) if got and all(isinstance(v, float) for v in got) else None


def ablation_steps(table: Table, output_dir: str) -> list[tuple[str, str, float | None]]:
  """The ablation's steps: (title, lever, the main probe's mean over its label seeds or None)."""
  steps = []
  rows, columns = {r.key for r in table.rows}, {c.key for c in table.columns}
  for row, column, lever, title in ABLATION:
    if row not in rows or column not in columns:
      continue
    results = privacy_table._read_json(  # pylint: disable=protected-access
        os.path.join(output_dir, "cells", row, column, "results.json")) or {}
    steps.append((title, lever, _mean(results, table.gate_keys)))
  return steps


def checks(table: Table, records, gate: table_report.Gate) -> list[str]:
  """Per DP cell at epsilon = 8: whether it passes the gate (the goal's first half), and its
  distance from the synthetic init it starts from; the ablation's steps, each lever's worth."""
  lines = []
  ours = {(r["evaluation"], r["row"], r["column"]): r["ours"] for r in records}
  keys = gate.evaluations
  synthetic = [ours.get((k, "synthetic", "")) for k in keys]
  synthetic = synthetic if all(isinstance(v, float) for v in synthetic) else None
  for r in table.rows:
    if not r.federated:
      continue
    for c in table.columns:
      if epsilon_of(c) != 8.0 or r.skip_reason(c):
        continue
      got = [ours.get((k, r.key, c.key)) for k in keys]
      if not all(isinstance(v, float) for v in got):
        continue
      passed = gate.passes(r.key, c.key)
      where = (f"K = {ABLATION_K:,}, ε = 8, ablation step {c.label!r}" if c.key.startswith("abl_")
               else f"{c.label}, ε = 8")
      line = (f"{r.name} at {where}: {' / '.join(table_report.fmt(v) for v in got)}; "
              + ("passes the gate" if passed else
                 f"does not pass the gate ({gate.why_not(r.key, c.key)})"))
      if r.init_from and synthetic:
        line += ("; over synthetic init " +
                 " / ".join(f"{100 * (a - b):+.1f}" for a, b in zip(got, synthetic)))
      nodp = [ours.get((k, r.key, f"k{ABLATION_K}_nodp")) for k in keys]
      if all(isinstance(v, float) for v in nodp):  # What the privacy costs, same users and rounds.
        line += (f"; from no DP at K = {ABLATION_K:,} " +
                 " / ".join(f"{100 * (a - b):+.1f}" for a, b in zip(got, nodp)))
      lines.append(line)
  return lines


def appendix(table: Table, output_dir: str) -> str:
  """The ablation (each lever's worth at K = 4,096, epsilon = 8) and the DP cells' noise."""
  lines = ["## The levers one at a time (DP-DCCO (CCO), K = 4,096, ε = 8)", "",
           "Each step adds one lever to the step before it; the main probe's mean over its label "
           "seeds; the EMA and synthetic-init steps are the grid's own cells.", "",
           "| step | main probe | the lever's worth (points) |", "|---|---|---|"]
  before = None
  for title, lever, acc in ablation_steps(table, output_dir):
    worth = (f"{100 * (acc - before):+.1f}" if acc is not None and before is not None and lever
             else "-")
    lines.append(f"| {title} | {table_report.fmt(acc) if acc is not None else '…'} | {worth} |")
    before = acc
  lines += ["", "## The DP cells' noise", "",
            "Medians over each DP cell's rounds (`aggregation.csv`; noise-to-signal: the noise's "
            "norm over the clipped sum's, a simulation's diagnostic outside the guarantee).", "",
            "| row | column | rounds | ε (run) | noise multiplier | statistics: noise / signal, "
            "clipped | update: noise / signal, clipped |", "|---|---|---|---|---|---|---|"]
  for r in table.rows:
    for c in table.columns:
      cell = os.path.join(output_dir, "cells", r.key, c.key)
      results = privacy_table._read_json(  # pylint: disable=protected-access
          os.path.join(cell, "results.json"))
      if math.isinf(epsilon_of(c)) or r.skip_reason(c) or not results:
        continue
      summary = scaling.noise_summary(cell)

      def release(name):
        s = summary.get(name)
        return f"{s['noise_to_signal']:.3g}, {s['clipped_fraction']:.2f}" if s else "-"

      lines.append(f"| {r.name} | {c.label}, {c.group} | {table.cell_config(r, c).rounds:,} | "
                   f"{results.get('epsilon', math.nan):.3f} | "
                   f"{results.get('dp_noise_multiplier', math.nan):.3f} | "
                   f"{release('statistics')} | {release('update')} |")
  return "\n".join(lines) + "\n"


def mini() -> Table:
  base = ExperimentConfig(method="dcco", dataset=MINI_DATASET, encoder="resnet14", width=1.0,
                          stem_stride=2, pool_grid=2, crop_min_scale=0.5, blur=False, cco_lambda=2.0,
                          projector=(512, 512, 512), rounds=MINI_ROUNDS[ABLATION_K],
                          num_clients=POPULATION, samples_per_client=1, clients_per_round=128,
                          server_optimizer="adam", server_learning_rate=5e-3, checkpoint_every=50,
                          log_every=50, seed=0)
  grid = _columns(MINI_ROUNDS)
  ablation = _ablation_columns()
  columns = grid + ablation
  rows = _rows(base, tuple(c.key for c in grid))
  dp = [c.apply(r.config) for r in rows if r.federated for c in columns
        if not math.isinf(epsilon_of(c)) and not r.skip_reason(c)]
  return Table(
      name=NAME, scale="mini", title=TITLE, rows=rows, columns=columns,
      evaluations=TUNED_10_TWO_SEEDS, paper={}, curve_every=0,
      selection_column=f"k{max(MINI_ROUNDS)}_nodp", supervised_epochs=0,
      notes=(
          "Mini scale, in the mini regime (shifted Fashion-MNIST): 60,000 one-image users (DCCO) "
          "or 15,000 users of 4 images (FedAvg); rounds per cohort to fit "
          f"{CELL_MINUTES} minutes a cell on 2 AVX-512 cores "
          f"({', '.join(f'K = {k:,}: {n:,}' for k, n in MINI_ROUNDS.items())}); each cell's "
          "measured time is in timing.json.",
          "Every DP cell: the update's clip adaptive (the users' median norm, from the scaling "
          "table's pilots' medians, PILOT_NORMS); DP-DCCO's statistics clip fixed at its bound; "
          "the noise multiplier calibrated to the column's epsilon for the cell's rounds by PLD "
          "with Poisson sampling (add/remove). The ablation's first step is the scaling table's "
          "convention and clips.",
          "The learning rates are the DP scaling table's (server Adam 5e-3), not chosen again "
          "here."),
      checks=checks, claims=claims(rows, columns), appendix=appendix,
      column_heading=f"cohort and privacy (ε by {privacy_lib.conventions(dp)})",
      gate_evaluations=TUNED_GATE)


SCALES = {"mini": mini}
