"""L-DAWA (Rehman et al., 2023), Table 2: cross-silo FedSSL with non-IID clients, linear probes.

Rows: the aggregation strategies FedAvg, Loss, FedU, EUC, L-DAWA, L-DAWA_FedAvg, L-DAWA_Loss,
L-DAWA_FedU. EUC is the paper's reference [19], Lee et al. 2021's FedLAMA (layer-wise adaptive
aggregation intervals, `--method=fedlama`, `tff_ssl.methods.fedlama`; the paper gives no settings
for it: base interval 1 round, phi = 2). Columns:
the SSL method, SimCLR and Barlow Twins (and, at paper scale, the dataset: CIFAR-10 and CIFAR-100).
Evaluations: linear probe on 100%, 10% and 1% of the labels. Every cell is a FedAvg-style run
(`tff_ssl.methods.fedavg`) with the row's `--aggregator`; FedU's rows have stateful FedU clients
(`--method=fedu`, `tff_ssl.methods.fedu`), whose projector takes the part of BYOL's predictor.

  paper  CIFAR-10 / CIFAR-100 (tfds), 10 clients all participating, Dirichlet alpha = 0.1 label split
         (clients of unequal size), 200 rounds, E = 10 local epochs of batch 256, client SGD lr 0.03,
         momentum 0.9, weight decay 1e-4 (Sec. 4.2, from Tamkin et al.), server: the aggregate as the
         new global model (SGD, learning rate 1, constant). ResNet-18 with GroupNorm + Weight
         Standardization (the paper's has BatchNorm; this project's models are batch-free).
  mini   the same grid in the mini regime (docs/mini_regime.md) with the paper's order of local
         work, so that clients drift and L-DAWA's deltas lie below 1: shifted Fashion-MNIST (compared
         with the paper's CIFAR-10 numbers), 20,000 random training images over 5 clients
         (Dirichlet 0.1), every client taking 300 (SimCLR, 3 rounds) or 150 (Barlow Twins, 4
         rounds) steps of batch 64 a round (`--local_unit=steps`; the paper's ~200), the gate's
         ResNet-14 (stride-2 stem, 2 x 2 grid pooling) with batch-statistics heads, crops >= 50%;
         Barlow Twins on the ResNet's 128-d output, as in the authors' code. Main probe: the tuned
         probe at 10% of the labels and two label seeds, and the gate; then the paper's three
         probes. Extra rows: the authors' FedAvg warm-up (L-DAWA) and a second seed of FedAvg, L-DAWA
         and L-DAWA_FedAvg. Every cell records its kernel norms per round, and the table's doc its
         deltas (`divergence_appendix`).

Table ldawa_collapse (`collapse`, mini only): the mini table's rows with Barlow Twins at a 512-wide
projection, 5 rounds of 150 local steps, where L-DAWA collapses, and the control run that separates
weight standardization from L-DAWA's scaling (FedAvg and L-DAWA with plain convolutions).

Neither the paper nor its setup states SimCLR's temperature or Barlow Twins' lambda; we take
tau = 0.07 at paper scale (Tamkin et al.'s SimCLR setting; the mini scale takes the centralized gate's
SimCLR heads, 128-128-64 and tau = 0.1) and Barlow Twins' lambda = 5e-3 (Zbontar et al.), i.e.
cco_lambda = 5e-3 (d - 1) for a d-dimensional projection. The paper's linear probe (SGD, 100 epochs)
is replaced by this project's protocol (features standardized, LARS), the same in every cell.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re

import numpy as np

from tff_ssl import aggregators, evaluation, methods
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.tables import TUNED_10_TWO_SEEDS, TUNED_GATE, Claim, Column, Evaluation, Row, Table

NAME = "ldawa_table2"
TITLE = "L-DAWA Table 2: cross-silo FedSSL (10 clients, Dirichlet 0.1), linear probes"

EVALUATIONS = (
    Evaluation("linear_100", "Linear probe, 100% labels", evaluation.LinearProbeConfig(
        label_fraction=1.0, steps=1000, batch_size=512, optimizer="lars", learning_rate=2.0)),
    Evaluation("linear_10", "Linear probe, 10% labels", evaluation.LinearProbeConfig(
        label_fraction=0.1, steps=1000, batch_size=512, optimizer="lars", learning_rate=2.0)),
    Evaluation("linear_1", "Linear probe, 1% labels", evaluation.LinearProbeConfig(
        label_fraction=0.01, steps=400, batch_size=128, optimizer="lars", learning_rate=2.5)),
)

# The mini regime's: the tuned probe at 10% of the labels and two label seeds (main, and what the gate
# reads), then the paper's three probes.
MINI_EVALUATIONS = TUNED_10_TWO_SEEDS + EVALUATIONS

# (key, name, the fields that make the row): the aggregator, and for FedU's rows the stateful FedU
# clients (`tff_ssl.methods.fedu`: with SimCLR and Barlow Twins the projector is the head a client
# keeps when diverged).
ROWS = (("fedavg", "FedAvg", {"aggregator": "fedavg"}), ("loss", "Loss", {"aggregator": "loss"}),
        ("fedu", "FedU", {"method": "fedu", "aggregator": "fedavg"}),
        ("euc", "EUC (FedLAMA)", {"method": "fedlama"}),
        ("ldawa", "L-DAWA", {"aggregator": "ldawa"}),
        ("ldawa_fedavg", "L-DAWA_FedAvg", {"aggregator": "ldawa_fedavg"}),
        ("ldawa_loss", "L-DAWA_Loss", {"aggregator": "ldawa_loss"}),
        ("ldawa_fedu", "L-DAWA_FedU", {"method": "fedu", "aggregator": "ldawa_fedavg"}))

# The paper's Table 2 (percent), per dataset and SSL method: (100%, 10%, 1%) for each row. (The
# paper prints the columns in the order 100%, 1%, 10%.)
_PAPER = {
    ("cifar10", "simclr"): {"fedavg": (71.07, 66.13, 53.32), "loss": (71.34, 69.91, 60.14),
                            "fedu": (70.36, 69.77, 61.74), "euc": (70.51, 69.37, 60.77),
                            "ldawa_fedu": (76.23, 72.89, 64.06),
                            "ldawa": (75.60, 71.40, 62.19), "ldawa_fedavg": (75.72, 73.29, 63.74),
                            "ldawa_loss": (76.55, 72.82, 63.86)},
    ("cifar10", "barlow_twins"): {"fedavg": (65.02, 57.06, 43.29), "loss": (57.12, 54.10, 42.70),
                                  "fedu": (64.55, 61.96, 50.95), "euc": (63.60, 62.61, 49.62),
                                  "ldawa_fedu": (69.50, 67.42, 58.67),
                                  "ldawa": (69.31, 68.38, 57.62),
                                  "ldawa_fedavg": (69.14, 67.61, 58.98),
                                  "ldawa_loss": (69.46, 66.82, 58.74)},
    ("cifar100", "simclr"): {"fedavg": (43.85, 36.49, 21.35), "loss": (44.69, 37.14, 20.90),
                             "fedu": (44.31, 36.76, 20.86), "euc": (44.89, 36.90, 21.96),
                             "ldawa_fedu": (50.59, 39.76, 21.72),
                             "ldawa": (49.88, 39.41, 21.53), "ldawa_fedavg": (49.99, 39.57, 21.87),
                             "ldawa_loss": (50.29, 39.72, 21.43)},
    ("cifar100", "barlow_twins"): {"fedavg": (35.70, 27.04, 12.93), "loss": (34.76, 23.88, 11.08),
                                   "fedu": (35.25, 26.72, 12.57), "euc": (35.44, 27.07, 12.43),
                                   "ldawa_fedu": (41.72, 31.91, 17.28),
                                   "ldawa": (41.85, 32.12, 16.92),
                                   "ldawa_fedavg": (41.49, 32.20, 17.35),
                                   "ldawa_loss": (41.89, 31.88, 16.36)},
}
_SSL_NAMES = {"simclr": "SimCLR", "barlow_twins": "Barlow Twins"}


def _paper_numbers(columns: dict[str, tuple[str, str]]) -> dict[tuple[str, str, str], float]:
  """{(evaluation, row, column): number} for columns keyed to the paper's (dataset, method)."""
  out = {}
  for column, source in columns.items():
    for row, values in _PAPER[source].items():
      for e, v in zip(EVALUATIONS, values):
        out[(e.key, row, column)] = v
  return out


def _ssl_column(key: str, group: str, ssl: str, *, projector, temperature: float,
                bt_lambda: float, dataset: str | None = None, title: str = "",
                **settings) -> Column:
  """A column of one SSL method (`settings`: further config fields it sets, e.g. its local work)."""
  d = projector[-1]
  if ssl == "simclr":
    fields = {"ssl": "simclr", "temperature": temperature}
  else:  # Barlow Twins is the CCO loss with lambda_BT = cco_lambda / (d - 1).
    fields = {"ssl": "cco", "cco_lambda": round(bt_lambda * (d - 1), 6)}
  if dataset:
    fields["dataset"] = dataset
  fields["projector"] = tuple(projector)
  fields.update(settings)
  return Column(key, group, overrides=tuple(fields.items()), title=title or _SSL_NAMES[ssl])


# Where the paper makes its claims about these rows (Sec. 5.4.1, on Table 2).
LDAWA_ABOVE_BASELINES = ('Sec. 5.4.1 on Table 2: "L-DAWA achieves higher performance on all of the '
                         'settings compared to the baselines (FedAvg, Loss, FedU, and EUC)"')
DIVERGENCE_IMPROVES = ('Sec. 5.4.1: "the modified versions of FedAvg, Loss, and FedU (L-DAWA_FedAvg, '
                       'L-DAWA_Loss and L-DAWA_FedU) provide better and unbiased results once the '
                       'layer-wise divergence is introduced into the aggregation"')
# (better, base, source): the paper's rows, then the mini table's second seed, the authors' FedAvg
# warm-up (their code's L-DAWA) and the collapse table's plain-convolution control.
CLAIM_PAIRS = (
    ("ldawa", "fedavg", LDAWA_ABOVE_BASELINES), ("ldawa", "loss", LDAWA_ABOVE_BASELINES),
    ("ldawa", "fedu", LDAWA_ABOVE_BASELINES), ("ldawa", "euc", LDAWA_ABOVE_BASELINES),
    ("ldawa_fedavg", "fedavg", DIVERGENCE_IMPROVES), ("ldawa_loss", "loss", DIVERGENCE_IMPROVES),
    ("ldawa_fedu", "fedu", DIVERGENCE_IMPROVES),
    ("ldawa_s1", "fedavg_s1", LDAWA_ABOVE_BASELINES),
    ("ldawa_fedavg_s1", "fedavg_s1", DIVERGENCE_IMPROVES),
    ("ldawa_warmup", "fedavg", LDAWA_ABOVE_BASELINES),
    ("ldawa_nows", "fedavg_nows", LDAWA_ABOVE_BASELINES))


def claims(rows) -> tuple[Claim, ...]:
  """The paper's claims between the rows the table has."""
  keys = {r.key for r in rows}
  return tuple(Claim(better, base, source) for better, base, source in CLAIM_PAIRS
               if better in keys and base in keys)


# A normalization layer's name (GroupNorm in the encoder, batch statistics in the heads): L-DAWA
# leaves these unscaled by default (`scale_normalization`), so the mean delta skips them.
_NORMALIZATION = re.compile(r"_(gn|bn)\d*$")


def round_series(path: str) -> dict[str, list[float]]:
  """From a run's aggregation.csv, per round: `layer_delta`, the mean over the round's clients and
  the layers L-DAWA scales of delta_k^(l) (L-DAWA rows); `model_delta`, the mean whole-model cosine
  (every row that measures it); `kernel_norm_conv` / `kernel_norm_dense`, the global model's kernel
  norms over their initial norms (`--measure_weight_norms`)."""
  out: dict[str, list[float]] = {}
  with open(path) as f:
    for rec in csv.DictReader(f):
      if rec.get("fedavg_warmup") not in (None, "", "0.0", "0"):
        layer = [np.nan]  # A warm-up round scales nothing.
      else:
        layer = [float(v) for k, v in rec.items() if k.startswith("layer_delta/") and v and
                 not _NORMALIZATION.search(k[len("layer_delta/"):])]
      values = {"layer_delta": float(np.mean(layer)) if layer else None}
      for k in ("model_delta", "kernel_norm_conv", "kernel_norm_dense"):
        values[k] = float(rec[k]) if rec.get(k) else None
      for k, v in values.items():
        if v is not None:
          out.setdefault(k, []).append(v)
  return out


_SERIES = (("layer_delta", "mean delta of the scaled layers"), ("model_delta", "whole-model cosine"),
           ("kernel_norm_conv", "conv kernel norm / initial"),
           ("kernel_norm_dense", "head kernel norm / initial"))


def divergence_appendix(table: Table, output_dir: str) -> str:
  """Markdown: each cell's divergence and kernel norms per round (aggregation.csv)."""
  lines = ["## Divergence and kernel norms per round", "",
           "From each cell's `aggregation.csv`: the mean over a round's clients of L-DAWA's delta "
           "over the layers it scales (convolutions and dense layers, not normalization), the mean "
           "whole-model cosine between a client's model and the global one, and the global model's "
           "kernel norms over their initial norms after the round (mean over layers). A warm-up "
           "round scales nothing (-).", ""]
  for c in table.columns:
    lines += [f"### {c.group} {c.label}".rstrip(), "", "| row | " + " | ".join(
        t for _, t in _SERIES) + " |", "|---|" + "---|" * len(_SERIES)]
    for r in table.rows:
      path = os.path.join(output_dir, "cells", r.key, c.key, "aggregation.csv")
      if not os.path.exists(path):
        continue
      series = round_series(path)
      cells = [" ".join("-" if np.isnan(v) else f"{v:.2f}" for v in series.get(k, [])) or "-"
               for k, _ in _SERIES]
      lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines)




def _table(scale: str, base: ExperimentConfig, columns: tuple[Column, ...], paper_keys,
           curve_every: int, notes: tuple[str, ...], extra_rows=(), mini: bool = False) -> Table:
  def config(fields):
    c = dataclasses.replace(base, **fields)
    # The rows whose strategy measures the whole-model cosine only when asked (L-DAWA measures its
    # own), where the method reads the option (FedLAMA does not).
    if (mini and "measure_divergence" in methods.get(c.method).field_names and
        aggregators.AGGREGATORS[c.aggregator].measures_on_request):
      c = dataclasses.replace(c, measure_divergence=True)
    return c
  rows = tuple(Row(key, name, config(fields)) for key, name, fields in ROWS)
  rows += tuple(Row(key, name, config(fields), columns=only)
                for key, name, fields, only in extra_rows)
  return Table(
      name=NAME, scale=scale, title=TITLE, rows=rows, columns=columns,
      evaluations=MINI_EVALUATIONS if mini else EVALUATIONS,
      paper=_paper_numbers(paper_keys), curve_every=curve_every,
      selection_column=columns[0].key, supervised_epochs=0, notes=notes, claims=claims(rows),
      column_heading="SSL method", gate_evaluations=TUNED_GATE if mini else (),
      appendix=divergence_appendix if mini else None)


def _base(**fields) -> ExperimentConfig:
  """The cross-silo FedAvg-style setting both scales share (Sec. 4.2)."""
  return ExperimentConfig(**{
      "method": "fedavg", "ssl": "simclr", "partition": "dirichlet_split", "alpha": 0.1, "num_clients": 10,
      "clients_per_round": 10, "client_optimizer": "sgdm", "client_learning_rate": 0.03,
      "client_weight_decay": 1e-4, "server_optimizer": "sgd", "server_learning_rate": 1.0,
      "server_lr_schedule": "constant", "simulation": "reference", "blur": False,
      "eval_label_fraction": 1.0, "seed": 0, **fields})


def paper() -> Table:
  base = _base(dataset="cifar10", encoder="resnet18", rounds=200, local_steps=10,
               local_batch_size=256, crop_min_scale=0.08, checkpoint_every=10, log_every=10)
  columns = tuple(_ssl_column(f"{ds}_{ssl}", ds.upper().replace("CIFAR", "CIFAR-"), ssl,
                              projector=(2048, 128) if ssl == "simclr" else (2048, 2048),
                              temperature=0.07, bt_lambda=5e-3, dataset=ds)
                  for ds in ("cifar10", "cifar100") for ssl in ("simclr", "barlow_twins"))
  keys = {c.key: (c.key.split("_", 1)[0], c.key.split("_", 1)[1]) for c in columns}
  return _table("paper", base, columns, keys, curve_every=50, notes=(
      "Paper scale: built for a GPU (ResNet-18, 200 rounds of 10 clients x 10 epochs).",))


def _mini_base(rounds: int) -> ExperimentConfig:
  # The mini regime (docs/mini_regime.md): shifted Fashion-MNIST, the gate's ResNet-14 (stride-2
  # stem, 2 x 2 grid pooling) with batch-statistics heads, crops >= 50%. The local work is the
  # paper's order (about 200 steps a client a round): every client takes MINI_LOCAL_STEPS steps of
  # batch MINI_BATCH a round (`--local_unit=steps`: Dirichlet clients differ in size, and with epochs
  # the smallest would take a few dozen), with the paper's client optimizer; fewer, larger clients
  # than the paper's 10, so that the table fits in 2 hours on 2 cores.
  return _base(dataset=MINI_DATASET, encoder="resnet14", width=1.0, stem_stride=2, pool_grid=2,
               head_norm="batch", num_clients=MINI_CLIENTS, clients_per_round=MINI_CLIENTS,
               split_samples=MINI_SAMPLES, rounds=rounds, local_unit="steps",
               local_steps=MINI_LOCAL_STEPS, local_batch_size=MINI_BATCH, crop_min_scale=0.5,
               measure_weight_norms=True, checkpoint_every=rounds // 2, log_every=1)


def _mini_notes(rounds, steps) -> str:
  return (f"Mini scale, in the mini regime: shifted Fashion-MNIST ({MINI_SAMPLES:,} training images "
          f"split over {MINI_CLIENTS} clients, Dirichlet 0.1), ResNet-14 with a stride-2 stem, 2 x 2 "
          f"grid pooling and batch-statistics heads, crops >= 50%, {rounds} rounds of {steps} local "
          f"steps of batch {MINI_BATCH} a client (SGD 0.03, momentum 0.9, weight decay 1e-4); the "
          f"paper's numbers are CIFAR-10's after 200 rounds of 10 epochs (ResNet-18): compare "
          f"orderings, not absolute numbers.")


def mini() -> Table:
  # Each column's local work is sized so that L-DAWA's deltas lie in 0.5-0.95 for most of the run
  # (measured, docs/results.md): SimCLR's clients drift less per step than Barlow Twins', so they take
  # MINI_SIMCLR_LOCAL_STEPS, over MINI_SIMCLR_ROUNDS rounds (the deltas rise as the loss falls, and
  # the table fits in 2 hours). SimCLR's heads are the centralized gate's (tasks/centralized_gate.py),
  # where they pass with batch statistics; Barlow Twins' are the L-DAWA authors' (their code: the
  # ResNet's 128-d output, lambda 5e-3). The 512-wide projection collapses under L-DAWA: table
  # ldawa_collapse (`collapse`) keeps that account and its control run.
  columns = (
      _ssl_column("simclr", "Fashion-MNIST (shifted)", "simclr", projector=(128, 128, 64),
                  temperature=0.1, bt_lambda=5e-3, local_steps=MINI_SIMCLR_LOCAL_STEPS,
                  rounds=MINI_SIMCLR_ROUNDS),
      _ssl_column("barlow_twins", "Fashion-MNIST (shifted)", "barlow_twins",
                  projector=MINI_BT_PROJECTOR, temperature=0.1, bt_lambda=5e-3))
  return _table("mini", _mini_base(MINI_ROUNDS), columns,
                {c.key: ("cifar10", c.key) for c in columns}, curve_every=MINI_ROUNDS,
                extra_rows=MINI_EXTRA_ROWS, mini=True, notes=(
                    _mini_notes(f"{MINI_SIMCLR_ROUNDS} (SimCLR) or {MINI_ROUNDS} (Barlow Twins)",
                                f"{MINI_SIMCLR_LOCAL_STEPS} (SimCLR) or {MINI_LOCAL_STEPS} (Barlow "
                                f"Twins)"),
                    "Barlow Twins on the ResNet's 128-d output with lambda 5e-3, as in the L-DAWA "
                    "authors' code; at a 512-wide projection L-DAWA collapses (table "
                    f"{COLLAPSE_NAME})."))


def collapse() -> Table:
  """Barlow Twins' collapse under L-DAWA at a 512-wide projection (512-512-512, lambda 5e-3) in the
  mini regime (5 rounds of 150 local steps), with the control run that separates weight
  standardization from L-DAWA's scaling: FedAvg and L-DAWA with plain convolutions (each still
  followed by GroupNorm, so still invariant to its kernel's scale). Every cell records its kernel
  norms and deltas per round."""
  column = _ssl_column("barlow_twins", "Fashion-MNIST (shifted)", "barlow_twins",
                       projector=(512, 512, 512), temperature=0.1, bt_lambda=5e-3,
                       title="Barlow Twins, 512-wide projection")
  table = _table("mini", _mini_base(COLLAPSE_ROUNDS), (column,), {column.key: ("cifar10", column.key)},
                 curve_every=COLLAPSE_ROUNDS, extra_rows=MINI_EXTRA_ROWS + COLLAPSE_EXTRA_ROWS,
                 mini=True, notes=(_mini_notes(COLLAPSE_ROUNDS, str(MINI_LOCAL_STEPS)),))
  return dataclasses.replace(table, name=COLLAPSE_NAME, title=COLLAPSE_TITLE)


MINI_DATASET = "fashion_mnist_shifted"  # The mini regime's testbed (docs/mini_regime.md).
MINI_CLIENTS = 5
MINI_SAMPLES = 20_000
MINI_ROUNDS = 4
MINI_LOCAL_STEPS = 150
MINI_SIMCLR_LOCAL_STEPS = 300
MINI_SIMCLR_ROUNDS = 3
MINI_BATCH = 64
MINI_BT_PROJECTOR = (128,)

# The mini table's rows beyond the paper's: (key, name, fields, columns it runs in (empty: all)).
# The authors' FedAvg warm-up (their code: plain N_k-weighted FedAvg until the server holds a third
# global model, then L-DAWA's uniform 1/K mean); the second seed (partition, sampling,
# initialization and augmentations all follow it) of FedAvg, L-DAWA and L-DAWA_FedAvg.
MINI_EXTRA_ROWS = (
    ("ldawa_warmup", "L-DAWA, FedAvg warm-up (authors' code)",
     {"aggregator": "ldawa", "fedavg_warmup_rounds": 2}, ()),
    ("fedavg_s1", "FedAvg, seed 1", {"aggregator": "fedavg", "seed": 1}, ()),
    ("ldawa_s1", "L-DAWA, seed 1", {"aggregator": "ldawa", "seed": 1}, ()),
    ("ldawa_fedavg_s1", "L-DAWA_FedAvg, seed 1", {"aggregator": "ldawa_fedavg", "seed": 1}, ()),
)

# Barlow Twins' collapse at a 512-wide projection (`collapse`): the mini table's rows, and the
# control run without weight standardization.
COLLAPSE_NAME = "ldawa_collapse"
COLLAPSE_TITLE = ("L-DAWA's collapse with Barlow Twins at a 512-wide projection, and the control "
                  "run without weight standardization")
COLLAPSE_ROUNDS = 5
COLLAPSE_EXTRA_ROWS = (
    ("fedavg_nows", "FedAvg, plain convolutions (no WS)",
     {"aggregator": "fedavg", "weight_standardization": False}, ()),
    ("ldawa_nows", "L-DAWA, plain convolutions (no WS)",
     {"aggregator": "ldawa", "weight_standardization": False}, ()),
)

SCALES = {"mini": mini, "paper": paper}
COLLAPSE_SCALES = {"mini": collapse}
