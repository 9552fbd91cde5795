"""Privacy table: accuracy against client-level epsilon for DCCO, Contrastive + FedAvg and FedAvg-SimCLR.

`bin/reproduce --table=privacy --scale=mini` (2 CPU cores) or `--scale=paper` (a GPU).

Rows (each its own federation; every column runs it under the same settings but the privacy ones):
  dcco            DCCO, non-IID clients of 4 images (DCCO's Table 1, `tasks/dcco_table1.py`): DP-DCCO
                  clips and noises both of a round's releases, the clients' encoding statistics and
                  their updates (each a sum N_k x over the clients, over the public count of a round's
                  images), so a round composes two Gaussian mechanisms.
  fedavg_simclr   Contrastive + FedAvg on the same clients (Table 1's): DP-FedAvg, the uniform mean of
                  the clipped updates (the clients hold 4 images each: FedAvg's N_k / N is 1 / K).
  ldawa_simclr    FedAvg-SimCLR in L-DAWA's setting (`tasks/ldawa_table2.py`): 5 cross-silo clients of
                  Dirichlet-0.1 label skew and unequal size, 300 local steps a round. DP-FedAvg's
                  uniform mean (not N_k / N: a client's size would scale its sensitivity) in every
                  column, so the columns differ only in the noise. Its population is 5, so
                  delta = 1 / 5: client-level DP over five silos is a statement about five parties.
Columns: epsilon = infinity (no DP: the same row without clipping or noise), 8 and 2 at delta = 1 /
  population, the noise multiplier calibrated up front from the planned rounds and the fixed-size
  sampling (`tff_ssl.privacy.accounting`); every cell's epsilon after its last round is in its
  results.json, and the table's appendix.
Clips: each row's, from the clients' median norms measured without DP in pilots of the row's first
  rounds (`PILOT_NORMS`; aggregation.csv of a run with --dp_noise_multiplier=0 --dp_clip=0): the clip
  is that norm, the usual choice (McMahan et al., 2018, clip near the median update norm).

  mini   the mini regime (docs/mini_regime.md) on shifted Fashion-MNIST, where centralized CCO and
         SimCLR clear the gate: ResNet-14 (stride-2 stem, 2 x 2 grid pooling), crops >= 50%,
         lambda = 2; MINI_ROUNDS rounds of 32 clients (DCCO's Table 1 at non-IID 4: 15,000 clients,
         128 images a round), server Adam 5e-3 (the DCCO table's choice for both rows); FedAvg-SimCLR
         as the L-DAWA mini table's SimCLR column (batch-statistics heads, 3 rounds of 300 steps).
         Main probe: the tuned probe at 10% of the labels, two label seeds, and the gate.
  paper  CIFAR-100 for the non-IID rows (DCCO Table 1's paper settings: 100K rounds of 128 clients
         of 4 images), CIFAR-10 for L-DAWA's (200 rounds of 10 clients x 10 epochs): for a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from tff_ssl import evaluation, table_report
from tff_ssl import privacy as privacy_lib
from tff_ssl.experiment import ExperimentConfig
from tasks import dcco_table1
from tff_ssl.tables import TUNED_10_TWO_SEEDS, TUNED_GATE, Claim, Column, Evaluation, Row, Table

NAME = "privacy"
TITLE = "Privacy: accuracy against client-level epsilon (delta = 1 / population)"

EPSILONS = (math.inf, 8.0, 2.0)


def _columns() -> tuple[Column, ...]:
  cols = []
  for eps in EPSILONS:
    if math.isinf(eps):
      cols.append(Column("eps_inf", "", title="ε = ∞ (no DP)"))
    else:
      cols.append(Column(f"eps_{eps:g}", "", title=f"ε = {eps:g}", overrides=(
          ("dp", "gaussian_fixed"), ("dp_target_epsilon", eps))))
  return tuple(cols)


def epsilon_of(column: Column) -> float:
  return dict(column.overrides).get("dp_target_epsilon", math.inf)


# The mini rows' clips: the median over a pilot's rounds of the clients' mean norm without DP
# (docs/table_runs/privacy_pilots/*/aggregation.csv: --dp=gaussian_fixed --dp_noise_multiplier=0 --dp_clip=0
# [--dp_statistics_clip=0], no noise and no clip). DCCO, 60 rounds: N_k <>_k 995 in round 0, 1,910 median (rising), N_k Delta_k
# 33,600 in round 0, 2,820 median (falling); Contrastive + FedAvg, 60 rounds: Delta_k 35 in round 0,
# 5.3 median; FedAvg-SimCLR in L-DAWA's setting, its first 2 rounds: 20.8 and 16.3 (clip 18).
PILOT_NORMS = {"dcco": {"dp_statistics_clip": 1900.0, "dp_clip": 2800.0},
               "fedavg_simclr": {"dp_clip": 5.3},
               "ldawa_simclr": {"dp_clip": 18.0}}

# The centralized gate's length (1,000 steps of 128 images, tasks/centralized_gate.py), where
# centralized CCO and SimCLR clear it on shifted Fashion-MNIST; a DP round of 32 clients costs 0.5-0.6 s
# on 2 cores against 0.15-0.2 s without DP (per-client clipping loops over the clients).
MINI_ROUNDS = 1000
MINI_DATASET = "fashion_mnist_shifted"


def _non_iid_rows(base: ExperimentConfig, clips) -> tuple[Row, ...]:
  fed = dataclasses.replace(base, local_steps=1, client_optimizer="sgd", client_learning_rate=1.0,
                            server_optimizer="adam", server_learning_rate=5e-3, partition="dirichlet",
                            alpha=0.0)
  return (
      Row("dcco", "DCCO", dataclasses.replace(fed, method="dcco", **clips["dcco"])),
      Row("fedavg_simclr", "Contrastive + FedAvg", dataclasses.replace(
          fed, method="fedavg", ssl="simclr", projector=(128, 128, 64) if base.projector[0] <= 512
          else (256, 256, 128), temperature=0.1, **clips["fedavg_simclr"])),
  )


def claims(rows) -> tuple[Claim, ...]:
  """DCCO above Contrastive + FedAvg (DCCO Table 1's claim) at each epsilon."""
  keys = {r.key for r in rows}
  return ((Claim("dcco", "fedavg_simclr", dcco_table1.OUTPERFORMS_FEDAVG),)
          if {"dcco", "fedavg_simclr"} <= keys else ())


def checks(table: Table, records, gate: table_report.Gate) -> list[str]:
  """What each row keeps of its accuracy without DP (points, the main probe's label seeds)."""
  lines = []
  ours = {(r["evaluation"], r["row"], r["column"]): r["ours"] for r in records}
  for r in table.rows:
    base = [ours.get((k, r.key, "eps_inf")) for k in gate.evaluations]
    for c in table.columns[1:]:
      got = [ours.get((k, r.key, c.key)) for k in gate.evaluations]
      if all(isinstance(v, float) for v in base + got):
        lost = " / ".join(f"{100 * (a - b):+.1f}" for a, b in zip(got, base))
        lines.append(f"{r.name} at {c.label}: {' / '.join(table_report.fmt(v) for v in got)} "
                     f"({lost} points from no DP)")
  return lines


def appendix(table: Table, output_dir: str) -> str:
  """Accuracy against epsilon (privacy_curve.png) and each DP cell's epsilon, noise multiplier and
  clip diagnostics (results.json, aggregation.csv)."""
  lines = ["## Accuracy against epsilon", ""]
  png = _plot(table, output_dir)
  if png:
    lines += [f"![accuracy against epsilon]({os.path.basename(png)})", ""]
  lines += ["| row | column | epsilon (run) | delta | noise multiplier | clients clipped (last "
            "round) |", "|---|---|---|---|---|---|"]
  for r in table.rows:
    for c in table.columns[1:]:
      cell = os.path.join(output_dir, "cells", r.key, c.key)
      results = _read_json(os.path.join(cell, "results.json"))
      if not results:
        continue
      clipped = _last_row(os.path.join(cell, "aggregation.csv"))
      fraction = ", ".join(f"{k[:-len('clipped_fraction')].rstrip('_') or 'update'} {float(v):.2f}"
                           for k, v in clipped.items() if k.endswith("clipped_fraction"))
      lines.append(f"| {r.name} | {c.label} | {results.get('epsilon', float('nan')):.3f} | "
                   f"{results.get('delta', float('nan')):.2g} | "
                   f"{results.get('dp_noise_multiplier') or float('nan'):.3f} | {fraction or '-'} |")
  return "\n".join(lines) + "\n"


def _read_json(path):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _last_row(path) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    rows = [line.strip().split(",") for line in f if line.strip()]
  return dict(zip(rows[0], rows[-1])) if len(rows) > 1 else {}


def main_probe(table: Table, output_dir: str) -> tuple[dict, dict]:
  """({(row, column): the main probe's mean over its label seeds}, {baseline: mean}) from the cells'
  results.json and the folder's random_init.json (fractions)."""
  keys = table.gate_keys
  cells = {}
  for r in table.rows:
    for c in table.columns:
      results = _read_json(os.path.join(output_dir, "cells", r.key, c.key, "results.json")) or {}
      got = [results.get("evaluations", {}).get(k) for k in keys]
      if got and all(isinstance(v, float) for v in got):
        cells[(r.key, c.key)] = sum(got) / len(got)
  found = (_read_json(os.path.join(output_dir, "random_init.json")) or {}).get("baselines", {})
  base = {}
  for name in ("raw_pixels", "random_init"):
    got = [found.get(k, {}).get(name) for k in keys]
    if got and all(isinstance(v, float) for v in got):
      base[name] = sum(got) / len(got)
  return cells, base


def _plot(table: Table, output_dir: str) -> str | None:
  """privacy_curve.png: the main probe (mean over its label seeds) against epsilon, a line per row,
  raw pixels and random init as horizontal lines."""
  cells, base = main_probe(table, output_dir)
  if not cells:
    return None
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  # Epsilon on a log axis; "no DP" drawn one octave right of the largest epsilon.
  finite = [epsilon_of(c) for c in table.columns if not math.isinf(epsilon_of(c))]
  no_dp = 2 * max(finite) if finite else 1.0
  xs = {c.key: no_dp if math.isinf(epsilon_of(c)) else epsilon_of(c) for c in table.columns}
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  for r in table.rows:
    pts = sorted((xs[c], 100 * v) for (row, c), v in cells.items() if row == r.key)
    if pts:
      ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=r.name)
  for name, style in (("raw_pixels", ":"), ("random_init", "--")):
    if name in base:
      ax.axhline(100 * base[name], color="gray", linestyle=style, label=name.replace("_", " "))
  ticks = sorted(set(xs.values()))
  ax.set_xscale("log", base=2)
  ax.set_xticks(ticks)
  ax.set_xticklabels(["∞ (no DP)" if x == no_dp else f"{x:g}" for x in ticks])
  ax.set_xlabel("ε (δ = 1 / population)")
  ax.set_ylabel("main probe, mean of its label seeds (%)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  path = os.path.join(output_dir, "privacy_curve.png")
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def _table(scale: str, rows: tuple[Row, ...], notes: tuple[str, ...],
           evaluations: tuple[Evaluation, ...], gate: tuple[str, ...]) -> Table:
  columns = _columns()
  convention = privacy_lib.conventions(r.config for r in rows)
  return Table(
      name=NAME, scale=scale, title=TITLE, rows=rows, columns=columns, evaluations=evaluations,
      paper={}, curve_every=0, selection_column=columns[0].key, supervised_epochs=0, notes=notes,
      checks=checks, claims=claims(rows), appendix=appendix,
      column_heading=f"privacy (ε by {convention})",
      gate_evaluations=gate)


def mini() -> Table:
  base = ExperimentConfig(method="dcco", dataset=MINI_DATASET, encoder="resnet14", width=1.0,
                          stem_stride=2, pool_grid=2, crop_min_scale=0.5, blur=False, cco_lambda=2.0,
                          projector=(512, 512, 512), rounds=MINI_ROUNDS, num_clients=15_000,
                          samples_per_client=4, clients_per_round=32, checkpoint_every=250,
                          log_every=50, seed=0)
  ldawa = ExperimentConfig(
      method="fedavg", ssl="simclr", dataset=MINI_DATASET, encoder="resnet14", width=1.0,
      stem_stride=2, pool_grid=2, head_norm="batch", crop_min_scale=0.5, blur=False,
      projector=(128, 128, 64), temperature=0.1, partition="dirichlet_split", alpha=0.1,
      num_clients=5, clients_per_round=5, split_samples=20_000, rounds=3, local_unit="steps",
      local_steps=300, local_batch_size=64, client_optimizer="sgdm", client_learning_rate=0.03,
      client_weight_decay=1e-4, server_optimizer="sgd", server_learning_rate=1.0,
      server_lr_schedule="constant", simulation="reference", aggregator="uniform",
      checkpoint_every=1, log_every=1, seed=0, **PILOT_NORMS["ldawa_simclr"])
  rows = _non_iid_rows(base, PILOT_NORMS) + (
      Row("ldawa_simclr", "FedAvg-SimCLR (L-DAWA's setting, uniform mean)", ldawa),)
  return _table("mini", rows, notes=(
      f"Mini scale, in the mini regime (shifted Fashion-MNIST): the non-IID rows {MINI_ROUNDS} "
      f"rounds of 32 clients of 4 images; FedAvg-SimCLR 3 rounds of 5 silos x 300 steps.",
      "Clips from pilots without DP (PILOT_NORMS in tasks/privacy_table.py); the noise multiplier "
      "of each DP cell is calibrated to its epsilon before the run."),
      evaluations=TUNED_10_TWO_SEEDS, gate=TUNED_GATE)


def paper() -> Table:
  base = ExperimentConfig(method="dcco", dataset="cifar100", encoder="resnet14", width=1.0,
                          crop_min_scale=0.08, blur=False, cco_lambda=20.0,
                          projector=(1024, 1024, 1024), rounds=100_000, num_clients=12_500,
                          samples_per_client=4, clients_per_round=128, checkpoint_every=1000,
                          log_every=100, seed=0)
  ldawa = ExperimentConfig(
      method="fedavg", ssl="simclr", dataset="cifar10", encoder="resnet18", width=1.0,
      crop_min_scale=0.08, blur=False, projector=(2048, 128), temperature=0.07,
      partition="dirichlet_split", alpha=0.1, num_clients=10, clients_per_round=10, rounds=200,
      local_steps=10, local_batch_size=256, client_optimizer="sgdm", client_learning_rate=0.03,
      client_weight_decay=1e-4, server_optimizer="sgd", server_learning_rate=1.0,
      server_lr_schedule="constant", simulation="reference", aggregator="uniform",
      eval_label_fraction=1.0, checkpoint_every=10, log_every=10, seed=0, dp_clip=1.0)
  clips = {"dcco": {"dp_statistics_clip": 1.0, "dp_clip": 1.0}, "fedavg_simclr": {"dp_clip": 1.0}}
  rows = _non_iid_rows(base, clips) + (Row("ldawa_simclr", "FedAvg-SimCLR (L-DAWA's setting, "
                                           "uniform mean)", ldawa),)
  probe = (Evaluation("linear_10", "Linear evaluation, 10% labels", evaluation.LinearProbeConfig(
      label_fraction=0.1, steps=1000, batch_size=512, optimizer="lars", learning_rate=2.0)),)
  return _table("paper", rows, notes=(
      "Paper scale: built for a GPU (DCCO Table 1's CIFAR-100 settings, L-DAWA's CIFAR-10 ones); "
      "its clips are placeholders of 1.0 to be set from pilots on that scale, as the mini scale's "
      "were.",), evaluations=probe, gate=())


SCALES = {"mini": mini, "paper": paper}
