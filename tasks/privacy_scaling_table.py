"""DP scaling table (issue 53): accuracy and noise-to-signal of private FedSSL against the cohort K.

`bin/reproduce --table=privacy_scaling --scale=mini` (2 CPU cores) or `--scale=paper` (a GPU).

Why: noise on an averaged release has std z C / K, so its norm over the clipped mean's is about
z sqrt(d) / K; the published DP successes sit at z / K <= 1e-2 (TFF's tutorial: 120 clients a round;
ViP and DP-Cap: batches of 80K-1.3M). The privacy table (`tasks/privacy_table.py`: 32 clients a
round) is far from that; this table moves along K.

Rows (user-level DP, delta = 1 / population):
  dcco_cco       DP-DCCO with CCO over one-image users: every training image its own user
                 (partition per_image: 60,000 users of shifted Fashion-MNIST), so user-level DP is
                 example-level DP. Its two releases (the statistics, the update) are each clipped per
                 user and noised (`tff_ssl.methods.dcco`).
  dcco_vicreg    The same with VICReg.
  fedavg_simclr  The comparison: DP-FedAvg with a within-client loss (SimCLR, the privacy table's
                 Contrastive + FedAvg) over users of 4 images of one class (15,000 users): the same
                 images a round as the DCCO rows, a quarter of the users.
Columns: the cohort K in one-image users a round (FedAvg: K / 4 users of 4 images, `Column.in_images`),
  fixed-size sampling, at epsilon = 8 (K = 128, 1,024, 4,096); the largest K also at epsilon = 2 and
  without DP. The largest K is the "best K" by design, not by its test accuracy: noise-to-signal
  falls with K (z / K at epsilon = 8: 1.2e-2, 2.3e-3, 1.0e-3 for the mini columns' rounds). Two
  columns extrapolate with a simulated noise cohort (`--dp_noise_cohort`: the largest K's real
  users and rounds carrying the noise, and accounting, of a 16,384- or 60,000-user round; labelled
  "noise simulated for a cohort of K'"), in the DP-DCCO (CCO) row alone (`EXTRAPOLATED`: the
  comparison rows run the real cohorts). They sit at the largest K so that, beside its DP and no-DP
  cells, only the noise differs (z / K' at epsilon = 8 over its 200 rounds: 8.6e-4 and 4.2e-4); at
  K = 1,024's 900 rounds the noise of 16,384 users would be no lower than K = 4,096's own
  (z / K' = 1.8e-3).
Clipping: gaussian_adaptive for every DP cell (Andrew et al., 2021: each release's clip follows the
  users' median norm), from the pilots' median norms (`PILOT_NORMS`): a one-image user's update norm
  falls 18x in DCCO's first 40 rounds, which no fixed clip follows. DP-DCCO's statistics clip aims
  at the 0.9 quantile (`STATISTICS_QUANTILE`), its update's at the median: at the median the
  statistics clip fell below every user's norm at K = 4,096 and the encodings grew without bound
  (docs/privacy_scaling_mini.md); at 0.9 it stays above them (validation pilot k4096_E).
Rounds: each cell fits 40 minutes on 2 cores (measured per-round costs in `MINI_ROUNDS`), so the
  columns differ in rounds as well as in K; the noise multiplier of each cell is calibrated to its
  epsilon for its own rounds.
Reported per round (`aggregation.csv` of each cell): each release's noise-to-signal (the noise's norm
  over the clipped sum's), the clip, the clipped fraction; epsilon in `metrics.csv`. The appendix
  gives their medians, accuracy and noise-to-signal against K (`privacy_scaling.png`).

  mini   the mini regime (docs/mini_regime.md): ResNet-14 (stride-2 stem, 2 x 2 grid pooling), crops
         >= 50%, 512-wide projector, server Adam 5e-3; main probe: the tuned probe at 10% of the
         labels, two label seeds, and the gate.
  paper  CIFAR-10 (50,000 one-image users; FedAvg: 12,500 of 4), cohorts of 4,096-16,384: for a GPU.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import statistics as stats

from tasks import privacy_table
from tff_ssl import evaluation, methods, table_report
from tff_ssl import privacy as privacy_lib
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.tables import TUNED_10_TWO_SEEDS, TUNED_GATE, Claim, Column, Evaluation, Row, Table

NAME = "privacy_scaling"
TITLE = "DP scaling: accuracy and noise-to-signal against the cohort (delta = 1 / population)"

MINI_DATASET = "fashion_mnist_shifted"
# Rounds of each mini cohort, to fit 40 minutes a cell on 2 cores of an AMD EPYC (AVX-512): a DP-DCCO
# round of one-image users costs 0.45 s at K = 128, 2.35 s at K = 1,024 and about 9.5 s at K = 4,096
# (bin/train, measured 2026-12-01; 10 s at 4,096); 1,800-2,100 s of training, the rest for the probes.
MINI_ROUNDS = {128: 4000, 1024: 900, 4096: 200}
# The pilots' median norms over their 40 rounds without noise or clip (--dp_noise_multiplier=0
# --dp_clip=0 --dp_statistics_clip=0; aggregation.csv), the adaptive clips' starting values.
# DCCO at K = 128 one-image users (round 0, median, round 39): CCO's N_k <>_k 282, 452, 478 and
# N_k Delta_k 16,451, 1,782, 898; VICReg's 406, 605, 662 and 94, 45, 39. FedAvg-SimCLR at 32 users
# of 4 images: Delta_k 35, 5.5, 5.7 (the privacy table's pilot: 5.3 median).
PILOT_NORMS = {"dcco_cco": {"dp_statistics_clip": 450.0, "dp_clip": 1800.0},
               "dcco_vicreg": {"dp_statistics_clip": 600.0, "dp_clip": 45.0},
               "fedavg_simclr": {"dp_clip": 5.5}}
# DP-DCCO's statistics release: the adaptive clip's target unclipped quantile (--dp_statistics_quantile).
# One-image users' statistics norms lie close together (the clipped fraction of a round is 0 or 1),
# so the quantile sets how the clip sits against them: 0.5 oscillates across them, and in the
# K = 4,096 cell clipped every user from round 12 on, after which the encodings grew without bound;
# 0.9 falls 2% a round while no user is clipped and rises 18% when all are, so it stays above the
# norms (validation pilot `k4096_E_adaptive_q09`: statistics never clipped in 51 rounds, loss
# 2,813 -> 2,050).
STATISTICS_QUANTILE = 0.9
# ... and its geometric learning rate (--dp_statistics_clip_rate; TFF's default is 0.2). At 0.2 the
# K = 4,096 cell's clip fell 2% a round while the encodings shrank 53x (CCO) and 270x (VICReg), and
# ended 4-50x above the norms, where the noise it sets dominates the variances. At 1.0 (validation
# pilots `k4096_F_vicreg_q09_rate1`, `k4096_G_cco_q09_rate1`, about 50 rounds each) the clip stays
# 1.2-2.4x the norms and the statistics noise-to-signal 0.7-1.2 (CCO) and 1-3 (VICReg).
STATISTICS_CLIP_RATE = 1.0
# The paper scale's starting clips are placeholders of 1.0, to be set from pilots at that scale.
PAPER_NORMS = {"dcco_cco": {"dp_statistics_clip": 1.0, "dp_clip": 1.0},
               "dcco_vicreg": {"dp_statistics_clip": 1.0, "dp_clip": 1.0},
               "fedavg_simclr": {"dp_clip": 1.0}}


def _columns(rounds: dict[int, int], extrapolate: tuple[int, ...], population: int
             ) -> tuple[Column, ...]:
  """The cohorts at epsilon = 8, the largest at 2 and without DP, and the simulated noise cohorts
  at the largest K (its real users and rounds: only the noise differs from its own cells)."""
  ks = sorted(rounds)
  cols = []

  def cohort(k, eps, key, title, noise_cohort=0):
    overrides = [("rounds", rounds[k])]
    if not math.isinf(eps):
      overrides += [("dp", "gaussian_adaptive"), ("dp_target_epsilon", eps)]
    in_images = [("clients_per_round", k)]
    if noise_cohort:
      in_images.append(("dp_noise_cohort", noise_cohort))
    group = "no DP" if math.isinf(eps) else f"ε = {eps:g}"
    cols.append(Column(key, group, title=title,
                       overrides=tuple(overrides), in_images=tuple(in_images)))

  for k in ks:
    cohort(k, 8.0, f"k{k}", f"K = {k:,}")
  best = ks[-1]
  cohort(best, 2.0, f"k{best}_eps2", f"K = {best:,}")
  cohort(best, math.inf, f"k{best}_nodp", f"K = {best:,}")
  for k_noise in extrapolate:
    if best < k_noise <= population:
      cohort(best, 8.0, f"k{best}_as{k_noise}",
             f"K = {best:,}, noise of {k_noise:,} (simulated)", noise_cohort=k_noise)
  return tuple(cols)


def cohort_of(column: Column) -> int:
  """The column's K in one-image users (images a round)."""
  return dict(column.in_images)["clients_per_round"]


def noise_cohort_of(column: Column) -> int:
  return dict(column.in_images).get("dp_noise_cohort", 0)


def epsilon_of(column: Column) -> float:
  return dict(column.overrides).get("dp_target_epsilon", math.inf)


# The row the simulated noise cohorts run (why: SIMULATED_NOTE, issue 53's extrapolated cohort).
EXTRAPOLATED = "dcco_cco"
SIMULATED_NOTE = ("The simulated noise cohorts run DP-DCCO (CCO) alone: they extrapolate its accuracy "
                  "against z / K to the cohort at which it would pass the gate; the comparison rows "
                  "(and the claims) run the real cohorts.")


def _rows(base: ExperimentConfig, population: int, clips, columns: tuple[Column, ...]
          ) -> tuple[Row, ...]:
  """The three rows; the simulated noise cohorts run DP-DCCO (CCO) alone (`EXTRAPOLATED`)."""
  real = tuple(c.key for c in columns if not noise_cohort_of(c))

  def only(key):  # Every column, or the real cohorts.
    return () if key == EXTRAPOLATED else real

  dcco = dataclasses.replace(base, method="dcco", partition="per_image", num_clients=population,
                             samples_per_client=1, local_steps=1, client_optimizer="sgd",
                             client_learning_rate=1.0,
                             dp_statistics_quantile=STATISTICS_QUANTILE,
                             dp_statistics_clip_rate=STATISTICS_CLIP_RATE)
  fedavg = dataclasses.replace(
      base, method="fedavg", ssl="simclr", partition="dirichlet", alpha=0.0,
      num_clients=population // 4, samples_per_client=4, local_steps=1, client_optimizer="sgd",
      client_learning_rate=1.0, projector=(128, 128, 64) if base.projector[0] <= 512
      else (256, 256, 128), temperature=0.1)
  return (
      Row("dcco_cco", "DP-DCCO (CCO)", dataclasses.replace(dcco, ssl="cco", **clips["dcco_cco"]),
          columns=only("dcco_cco")),
      Row("dcco_vicreg", "DP-DCCO (VICReg)", dataclasses.replace(
          dcco, ssl="vicreg", **clips["dcco_vicreg"]), columns=only("dcco_vicreg")),
      Row("fedavg_simclr", "DP-FedAvg (SimCLR, users of 4 images)", dataclasses.replace(
          fedavg, **clips["fedavg_simclr"]), columns=only("fedavg_simclr")),
  )


# The claim this table tests: with one image a user, DCCO's two-phase round is what makes a
# batch-statistics loss clippable per user, and its rounds of thousands of one-image users are cheap.
HOME_GROUND = ("issue 53: DP-DCCO over one-image users above DP-FedAvg with a within-client loss "
               "over users of 4 images, at the same images a round and the same epsilon")


def claims(rows) -> tuple[Claim, ...]:
  keys = {r.key for r in rows}
  return tuple(Claim(dcco, "fedavg_simclr", HOME_GROUND) for dcco in ("dcco_cco", "dcco_vicreg")
               if {dcco, "fedavg_simclr"} <= keys)


# -- the report: checks, appendix --------------------------------------------------------------------

_read_json = privacy_table._read_json  # pylint: disable=protected-access


def _read_csv(path) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def noise_summary(cell_dir: str) -> dict:
  """Per release, the median over the cell's rounds of its noise-to-signal and clipped fraction
  (aggregation.csv), and the last round's clip; {} where the cell has not run with DP."""
  rows = _read_csv(os.path.join(cell_dir, "aggregation.csv"))
  out = {}
  for release, prefix in (("statistics", "statistics_"), ("update", "update_"),
                          ("update", "")):
    key = f"{prefix}noise_to_signal"
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    if not values or release in out:
      continue
    fraction_key = f"{prefix}clipped_fraction"
    clip_key = f"{prefix}clip" if prefix else "dp_clip"
    out[release] = {
        "noise_to_signal": stats.median(values),
        "clipped_fraction": stats.median(float(r[fraction_key]) for r in rows),
        "clip": float(rows[-1][clip_key]) if rows[-1].get(clip_key) else math.nan}
  return out


# The main probe's mean over its label seeds per cell, and the baselines: the privacy table's reading.
main_probe = privacy_table.main_probe

# A DP-DCCO cell whose users' statistics grew this many times over their first round's (the median
# norm, aggregation.csv) is marked diverged in the figure: its probe reads a blown-up encoder.
DIVERGED_GROWTH = 10.0


def statistics_growth(cell_dir: str) -> float:
  """The largest median statistics norm of the cell's rounds over its first round's (NaN without)."""
  rows = _read_csv(os.path.join(cell_dir, "aggregation.csv"))
  norms = [float(r["statistics_norm"]) for r in rows if r.get("statistics_norm") not in (None, "")]
  return max(norms) / norms[0] if norms and norms[0] > 0 else math.nan


def checks(table: Table, records, gate: table_report.Gate) -> list[str]:
  """The issue's goal, per row: whether DP at epsilon = 8 passes the gate at the largest cohort
  run, and each DP cell's distance from its row's no-DP cell (points, the main probe's seeds)."""
  lines = []
  ours = {(r["evaluation"], r["row"], r["column"]): r["ours"] for r in records}
  at_eps8 = [c for c in table.columns if epsilon_of(c) == 8.0 and not noise_cohort_of(c)]
  nodp = [c for c in table.columns if math.isinf(epsilon_of(c))]
  for r in table.rows:
    ran = [c for c in at_eps8 if all(isinstance(ours.get((k, r.key, c.key)), float)
                                     for k in gate.evaluations)]
    if ran:
      largest = max(ran, key=cohort_of)
      passed = gate.passes(r.key, largest.key)
      lines.append(f"{r.name} at ε = 8, largest cohort run ({largest.label}): "
                   + ("passes the gate" if passed else
                      f"does not pass the gate ({gate.why_not(r.key, largest.key)})"))
    for c in table.columns:
      if math.isinf(epsilon_of(c)) or not nodp:
        continue
      base = [ours.get((k, r.key, nodp[0].key)) for k in gate.evaluations]
      got = [ours.get((k, r.key, c.key)) for k in gate.evaluations]
      if all(isinstance(v, float) for v in base + got):
        lost = " / ".join(f"{100 * (a - b):+.1f}" for a, b in zip(got, base))
        lines.append(f"{r.name} at {c.label}, {c.group}: {' / '.join(table_report.fmt(v) for v in got)} "
                     f"({lost} points from no DP at K = {cohort_of(nodp[0]):,})")
  return lines


def appendix(table: Table, output_dir: str) -> str:
  """Accuracy and noise-to-signal against K (privacy_scaling.png), and each DP cell's epsilon (and
  its label), noise multiplier, and its releases' median noise-to-signal, clipped fraction and last
  clip."""
  lines = ["## Accuracy and noise-to-signal against the cohort", ""]
  png = _plot(table, output_dir)
  if png:
    lines += [f"![accuracy and noise-to-signal against K]({os.path.basename(png)})", ""]
  lines += ["Per round in each cell's `aggregation.csv` (noise-to-signal: the noise's norm over the "
            "clipped sum's, a simulation's diagnostic outside the guarantee) and `metrics.csv` "
            "(epsilon); medians over the rounds here.", "",
            "| row | column | rounds | epsilon (run) | noise multiplier | statistics: noise / signal, "
            "clipped | update: noise / signal, clipped | label |",
            "|---|---|---|---|---|---|---|---|"]
  for r in table.rows:
    for c in table.columns:
      if math.isinf(epsilon_of(c)):
        continue
      cell = os.path.join(output_dir, "cells", r.key, c.key)
      results = _read_json(os.path.join(cell, "results.json"))
      if not results:
        continue
      summary = noise_summary(cell)

      def release(name):
        s = summary.get(name)
        return f"{s['noise_to_signal']:.3g}, {s['clipped_fraction']:.2f}" if s else "-"

      rounds = dict(c.overrides).get("rounds", r.config.rounds)
      lines.append(f"| {r.name} | {c.label}, {c.group} | {rounds:,} | {results.get('epsilon', math.nan):.3f} | "
                   f"{_noise_multiplier(results, table.cell_config(r, c)):.3f} | "
                   f"{release('statistics')} | "
                   f"{release('update')} | {results.get('dp_label') or '-'} |")
  return "\n".join(lines) + "\n"


def _noise_multiplier(results: dict, config) -> float:
  """A DP cell's noise multiplier: its results.json's; runs from before the ledger combined
  gaussian_adaptive's two Gaussians (values, clipped count) wrote nan there, and for them it is the
  sigma the run was calibrated to (`PrivacyConfig.sigma` of the cell's config)."""
  got = results.get("dp_noise_multiplier")
  if got is not None and math.isfinite(got):
    return got
  return privacy_lib.from_config(config,
                                 releases=methods.get(config.method).dp_releases).sigma


def _plot(table: Table, output_dir: str) -> str | None:
  """privacy_scaling.png: the main probe (left) and each release's median noise-to-signal (right:
  the update solid, DP-DCCO's statistics dashed) against K at epsilon = 8, a line per row; the
  simulated noise cohorts as hollow markers at K' (their real K is the largest); raw pixels and
  random init as horizontal lines; a red cross on a cell whose statistics diverged
  (`DIVERGED_GROWTH`), the legends below the axes."""
  cells, base = main_probe(table, output_dir)
  columns = [c for c in table.columns if epsilon_of(c) == 8.0 and not noise_cohort_of(c)]
  simulated = [c for c in table.columns if epsilon_of(c) == 8.0 and noise_cohort_of(c)]
  ratios = {}
  for r in table.rows:
    for c in columns + simulated:
      summary = noise_summary(os.path.join(output_dir, "cells", r.key, c.key))
      for release in ("update", "statistics"):
        if summary.get(release):
          ratios[(r.key, c.key, release)] = summary[release]["noise_to_signal"]
  if not cells and not ratios:
    return None
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 5.6))
  for r in table.rows:
    acc = [(cohort_of(c), 100 * cells[(r.key, c.key)]) for c in columns if (r.key, c.key) in cells]
    if acc:
      left.plot(*zip(*acc), marker="o", label=r.name)
    color = left.lines[-1].get_color() if acc else None
    for release, style in (("update", "-"), ("statistics", "--")):
      ratio = [(cohort_of(c), ratios[(r.key, c.key, release)]) for c in columns
               if (r.key, c.key, release) in ratios]
      if ratio:
        right.plot(*zip(*ratio), marker="o", linestyle=style, color=color,
                   label=f"{r.name}: {release}")
        color = right.lines[-1].get_color()
      ratio = [(noise_cohort_of(c), ratios[(r.key, c.key, release)]) for c in simulated
               if (r.key, c.key, release) in ratios]
      if ratio:
        right.plot(*zip(*ratio), marker="s" if release == "update" else "D", linestyle="none",
                   fillstyle="none", color=color, label=f"{r.name}: {release}, simulated K'")
    acc = [(noise_cohort_of(c), 100 * cells[(r.key, c.key)]) for c in simulated
           if (r.key, c.key) in cells]
    if acc:
      left.plot(*zip(*acc), marker="o", linestyle="none", fillstyle="none", color=color,
                label=f"{r.name}: noise of K' simulated")
    diverged = f"users' statistics grew > {DIVERGED_GROWTH:g}× (diverged)"
    for c in columns + simulated:  # Diverged cells: a red cross and the growth.
      growth = statistics_growth(os.path.join(output_dir, "cells", r.key, c.key))
      if (r.key, c.key) in cells and growth > DIVERGED_GROWTH:
        x = noise_cohort_of(c) or cohort_of(c)
        left.plot([x], [100 * cells[(r.key, c.key)]], marker="x", color="red", markersize=9,
                  linestyle="none", label=diverged if diverged not in
                  [line.get_label() for line in left.lines] else None)
        left.annotate(f"statistics ×{growth:.0f}", (x, 100 * cells[(r.key, c.key)]),
                      textcoords="offset points", xytext=(-8, 7), fontsize=7, color="red",
                      ha="right")
  for name, style in (("raw_pixels", ":"), ("random_init", "--")):
    if name in base:
      left.axhline(100 * base[name], color="gray", linestyle=style, label=name.replace("_", " "))
  for ax in (left, right):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K: one-image users a round (FedAvg: the same images)\n"
                  "hollow: the largest K with the noise of K' users (simulated)")
  left.set_ylabel("main probe at ε = 8 (%),\nmean of its label seeds")
  right.set_yscale("log")
  right.set_ylabel("median noise / signal a round")
  for ax in (left, right):  # Below the axes: a legend inside hid lines.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
  fig.tight_layout()
  path = os.path.join(output_dir, "privacy_scaling.png")
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def _table(scale: str, rows: tuple[Row, ...], columns: tuple[Column, ...], notes: tuple[str, ...],
           evaluations: tuple[Evaluation, ...], gate: tuple[str, ...]) -> Table:
  nodp = [c.key for c in columns if math.isinf(epsilon_of(c))]
  convention = privacy_lib.conventions(r.config for r in rows)
  return Table(
      name=NAME, scale=scale, title=TITLE, rows=rows, columns=columns, evaluations=evaluations,
      paper={}, curve_every=0, selection_column=nodp[0], supervised_epochs=0, notes=notes,
      checks=checks, claims=claims(rows), appendix=appendix,
      column_heading=f"cohort and privacy (ε by {convention})",
      gate_evaluations=gate)


def mini() -> Table:
  base = ExperimentConfig(method="dcco", dataset=MINI_DATASET, encoder="resnet14", width=1.0,
                          stem_stride=2, pool_grid=2, crop_min_scale=0.5, blur=False, cco_lambda=2.0,
                          projector=(512, 512, 512), rounds=MINI_ROUNDS[1024], num_clients=60_000,
                          samples_per_client=1, clients_per_round=128, server_optimizer="adam",
                          server_learning_rate=5e-3, checkpoint_every=50, log_every=50, seed=0)
  columns = _columns(MINI_ROUNDS, (16_384, 60_000), 60_000)
  rows = _rows(base, 60_000, PILOT_NORMS, columns)
  return _table("mini", rows, columns, notes=(
      "Mini scale, in the mini regime (shifted Fashion-MNIST): 60,000 one-image users (DCCO) or "
      "15,000 users of 4 images (FedAvg); rounds per cohort to fit 40 minutes a cell on 2 cores of "
      f"an AMD EPYC ({', '.join(f'K = {k:,}: {n:,}' for k, n in MINI_ROUNDS.items())}; each cell's "
      "measured time is in timing.json; K = 4,096's DP cells took 36.6-43.4 minutes on Intel Xeons "
      "(Sapphire Rapids), which vary from machine to machine).",
      "Adaptive clipping (the users' median norm; DP-DCCO's statistics clip at the 0.9 quantile, "
      "STATISTICS_QUANTILE, with rate 1.0, STATISTICS_CLIP_RATE) from the pilots' medians "
      "(PILOT_NORMS in "
      "tasks/privacy_scaling_table.py); each DP cell's noise multiplier calibrated to its epsilon "
      "for its rounds. The largest K is the table's best K by design (lowest z / K), not chosen on "
      "test accuracy.",
      SIMULATED_NOTE), evaluations=TUNED_10_TWO_SEEDS, gate=TUNED_GATE)


def paper() -> Table:
  base = ExperimentConfig(method="dcco", dataset="cifar10", encoder="resnet18", width=1.0,
                          crop_min_scale=0.08, blur=False, cco_lambda=20.0,
                          projector=(1024, 1024, 1024), rounds=2000, num_clients=50_000,
                          samples_per_client=1, clients_per_round=4096, server_optimizer="adam",
                          server_learning_rate=5e-3, checkpoint_every=100, log_every=50, seed=0)
  columns = _columns({4096: 4000, 8192: 2000, 16_384: 1000}, (32_768,), 50_000)
  rows = _rows(base, 50_000, PAPER_NORMS, columns)
  probe = (Evaluation("linear_10", "Linear evaluation, 10% labels", evaluation.LinearProbeConfig(
      label_fraction=0.1, steps=1000, batch_size=512, optimizer="lars", learning_rate=2.0)),)
  return _table("paper", rows, columns, notes=(
      "Paper scale: CIFAR-10, cohorts of 4,096-16,384 one-image users, built for a GPU; its "
      "starting clips are placeholders of 1.0 to be set from pilots at that scale.",
      SIMULATED_NOTE),
      evaluations=probe, gate=())


SCALES = {"mini": mini, "paper": paper}
