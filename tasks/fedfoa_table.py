"""FedFoA (Liu et al.), Tables 1-3: feature-correlation alignment on top of FedBYOL, FedU and FedEMA
(homogeneous clients, Table 3), and between clients of different architectures that exchange nothing
but R (heterogeneous, Tables 1-2).

Rows: FedBYOL, FedU, FedEMA (`tff_ssl/methods/fedssl.py`; FedEMA with the autoscaler tau = 0.7),
each without and with `--fedfoa` (lambda = 0.01, t_warm = 5, `tff_ssl/methods/fedfoa.py`); and the
heterogeneous setting (`--method=heterogeneous`): "BYOL (alone)", every client training its own model,
and "FedFoA (heterogeneous)", the same clients exchanging R. Heterogeneous cells report the mean over
the architectures (the paper's "Avg."); the appendix has each architecture's number beside the
paper's. One column per dataset. Evaluations (`tables.TUNED_LINEAR_AND_KNN_100`): the tuned probe at
10% of the labels and two label seeds (the main probe and the gate's), the LARS linear probe on every
label (the runs' curves; the paper trains a linear layer for 200 epochs) and the kNN monitor (k = 200,
t = 0.1).

  paper  CIFAR-10 / CIFAR-100 (tfds), IID. Homogeneous: ResNet-18 (GroupNorm + Weight
         Standardization), 5 clients all in every round, 100 rounds of E = 5 local epochs of batch 500,
         client SGD lr 0.032 with momentum 0.9, BYOL target EMA 0.99, projection 256 (heads
         4096 -> 256), the aggregate as the new global model. Heterogeneous: 4 clients, ResNet-18,
         VGG-9, AlexNet and ResNet-34, each with a linear projector to 256 (the calibration layer),
         the same local training.
  mini   The mini regime (issue 31): shifted Fashion-MNIST, IID, 2,000 images a client, 20 rounds of
         2 local epochs of batch 64, batch-statistics heads (512 -> 64), crops >= 50%, client
         weight decay 5e-4. Homogeneous: 5 clients, ResNet-14 (stride-2 stem, 2 x 2 grid pooling).
         Heterogeneous: 4 clients, half-width ResNet-14, ResNet-18, VGG-9 and AlexNet with global
         pooling, each with a linear projector to 64. Main probe: the tuned regression at 10% of the
         labels, two label seeds (the gate's). Sized to finish within 90 minutes on 2 CPU cores.

What the paper does not give (its Appendix B is not in our sources): the number of homogeneous clients
and rounds (we take FedEMA's K = 5 and 100 rounds; its Fig. 4 runs past 50 rounds), the local epochs
(FedEMA's 5) and the heads (BYOL's 4096 -> 256). The heterogeneous baselines FedMD and FedDF need a
public or generated dataset and are not run; the paper's numbers for them are in the appendix.
"""

from __future__ import annotations

import dataclasses
import json
import os

from tff_ssl import evaluation, experiment, methods, rundir, table_report
from tff_ssl.experiment import ExperimentConfig
from tff_ssl import runner
from tff_ssl.methods import heterogeneous
from tff_ssl.tables import TUNED_GATE, TUNED_LINEAR_AND_KNN_100, Claim, Column, Row, Table

NAME = "fedfoa"
TITLE = ("FedFoA Tables 1-3: feature-correlation alignment on FedBYOL / FedU / FedEMA, and across "
         "heterogeneous architectures")

EVALUATIONS = TUNED_LINEAR_AND_KNN_100

HOMOGENEOUS = (
    ("fedbyol", "FedBYOL", {"method": "fedbyol"}),
    ("fedbyol_foa", "FedBYOL + FedFoA", {"method": "fedbyol", "fedfoa": True}),
    ("fedu", "FedU", {"method": "fedu"}),
    ("fedu_foa", "FedU + FedFoA", {"method": "fedu", "fedfoa": True}),
    ("fedema", "FedEMA", {"method": "fedema", "fedema_tau": 0.7}),
    ("fedema_foa", "FedEMA + FedFoA", {"method": "fedema", "fedema_tau": 0.7, "fedfoa": True}),
)
HETEROGENEOUS = (
    ("hetero_byol", "BYOL (alone, heterogeneous)", {"method": "heterogeneous"}),
    ("hetero_foa", "FedFoA (heterogeneous)", {"method": "heterogeneous", "fedfoa": True}),
)
# Where the paper makes its claims about these rows.
FOA_IMPROVES = ('Sec. 5 on Table 3: "FedFoA significantly improves the performance of all '
                'baselines" (FedBYOL, FedU, FedEMA)')
FOA_EMA_BEST = ('Sec. 5 on Table 3: "The best method is the integration with FedEMA and FedFoA, '
                'reaching 78.82% in CIFAR-10 and 49.87% in CIFAR-100"')
FOA_HETEROGENEOUS = ('Sec. 5 on Tables 1-2: "FedFoA can improve the accuracy to 77.35%" over BYOL '
                     'trained alone on heterogeneous clients (74.33%)')
# Which rows FedFoA should improve on, each (with, without), and its source.
PAIRS = (("fedbyol_foa", "fedbyol", FOA_IMPROVES), ("fedu_foa", "fedu", FOA_IMPROVES),
         ("fedema_foa", "fedema", FOA_IMPROVES), ("fedema_foa", "fedbyol_foa", FOA_EMA_BEST),
         ("fedema_foa", "fedu_foa", FOA_EMA_BEST), ("hetero_foa", "hetero_byol", FOA_HETEROGENEOUS))


def claims(rows) -> tuple[Claim, ...]:
  """The paper's claims between the rows the table has."""
  keys = {r.key for r in rows}
  return tuple(Claim(better, base, source) for better, base, source in PAIRS
               if better in keys and base in keys)

# The paper's numbers (percent): Table 3 "Last" (CIFAR-10, CIFAR-100), Tables 1-2 "Avg.".
PAPER_LINEAR = {
    "fedbyol": (73.76, 42.56), "fedbyol_foa": (78.54, 46.89),
    "fedu": (77.12, 44.85), "fedu_foa": (78.37, 47.29),
    "fedema": (75.48, 43.19), "fedema_foa": (78.82, 49.84),
    "hetero_byol": (74.33, 46.29), "hetero_foa": (77.35, 48.07),
}
# Tables 1-2 per architecture (ResNet-18, VGG-9, AlexNet, ResNet-34), CIFAR-10 then CIFAR-100, as
# printed. (Table 2's FedFoA row, 52.85 / 42.06 / 50.49 / 50.49, averages 48.97, not its 48.07.)
PAPER_ARCHITECTURES = ("ResNet-18", "VGG-9", "AlexNet", "ResNet-34")
PAPER_HETEROGENEOUS = {
    "BYOL": ((77.93, 73.49, 68.74, 77.14), (50.61, 45.59, 39.42, 49.52)),
    "FedMD": ((76.45, 74.32, 70.13, 76.74), (50.37, 45.98, 41.2, 49.17)),
    "FedDF": ((78.35, 74.54, 70.89, 78.43), (51.35, 46.24, 41.31, 49.87)),
    "FedFoA": ((80.45, 75.86, 71.95, 81.14), (52.85, 42.06, 50.49, 50.49)),
}
HETERO_PAPER_ROW = {"hetero_byol": "BYOL", "hetero_foa": "FedFoA"}


def _heterogeneous(row: Row) -> bool:
  """Whether the row's clients train encoders of several architectures (its method reads
  --architectures), each evaluated apart."""
  return "architectures" in methods.get(row.config.method).field_names


def random_init_each(table: Table, column: Column, output_dir: str) -> dict[str, dict[str, float]]:
  """{evaluation key: {architecture: accuracy}}: each heterogeneous architecture at its
  initialization under the main probe and each gate evaluation (the baseline of its cells),
  computed once per output folder (hetero_random_init.json)."""
  path = os.path.join(output_dir, "hetero_random_init.json")
  found = json.load(open(path)) if os.path.exists(path) else {}
  keys = tuple(dict.fromkeys((table.evaluations[0].key, *table.gate_evaluations)))
  if not all(k in found.get(column.key, {}) for k in keys):
    row = next(r for r in table.rows if _heterogeneous(r))
    config = table.cell_config(row, column)
    train, test = experiment.load_splits(config)
    models = heterogeneous.models_of(config, train.image_shape)
    protocols = {e.key: e.protocol for e in table.evaluations}
    found[column.key] = {
        k: {a: evaluation.evaluate(runner.keras_encoder(m, m.initial_weights), train, test,
                                   protocols[k])
            for a, m in zip(config.architectures, models)} for k in keys}
    rundir.write_atomic(path, json.dumps(found, indent=2, sort_keys=True) + "\n")
  return found[column.key]


def heterogeneous_baselines(table: Table, output_dir: str) -> dict:
  """The heterogeneous cells' random-init baseline (`Table.cell_baselines`): the mean over their
  architectures at initialization, as the cells report the mean of their clients' encoders."""
  out = {}
  for column in table.columns:
    rows = [r for r in table.rows if _heterogeneous(r) and os.path.exists(
        os.path.join(output_dir, "cells", r.key, column.key, "results.json"))]
    if not rows:
      continue
    each = random_init_each(table, column, output_dir)
    for row in rows:
      out[(row.key, column.key)] = {
          k: {"random_init": sum(v.values()) / len(v)} for k, v in each.items()
          if k in table.gate_keys}
  return out


def heterogeneous_appendix(table: Table, output_dir: str) -> str:
  """Each architecture's linear probe in the heterogeneous cells (results.json's
  `linear_probe_accuracy_pretrained_each`) beside its random initialization, and the paper's Tables
  1-2."""
  rows = [r for r in table.rows if _heterogeneous(r)]
  if not rows:
    return ""
  archs = rows[0].config.architectures
  lines = ["## Heterogeneous clients, each architecture", "",
           f"The main probe ({table.evaluations[0].name}) of each client's own encoder and of the "
           "same architecture at its initialization; the paper's Tables 1-2 (architectures "
           f"{', '.join(PAPER_ARCHITECTURES)}) follow.", ""]
  for column in table.columns:
    done = [r for r in rows if os.path.exists(
        os.path.join(output_dir, "cells", r.key, column.key, "results.json"))]
    if not done:
      continue
    initial = random_init_each(table, column, output_dir)[table.evaluations[0].key]
    lines += [f"**{column.group}**", "",
              "| row | " + " | ".join(archs) + " | mean |", "|---" * (len(archs) + 2) + "|",
              "| random init | " + " | ".join(table_report.fmt(initial[a]) for a in archs) +
              f" | {table_report.fmt(sum(initial.values()) / len(initial))} |"]
    for row in done:
      path = os.path.join(output_dir, "cells", row.key, column.key, "results.json")
      if not os.path.exists(path):
        continue
      with open(path) as f:
        result = json.load(f)
      main = table.evaluations[0].key
      if table.in_run_main:
        each = result.get("linear_probe_accuracy_pretrained_each")
      else:  # The main probe, evaluated on each architecture's encoder after the run.
        each = {a: e[main] for a, e in result.get("evaluations_each", {}).items() if main in e}
      if not each:
        continue
      lines.append(f"| {row.name} | " + " | ".join(table_report.fmt(each[a]) for a in archs) +
                   f" | {table_report.fmt(sum(each[a] for a in archs) / len(archs))} |")
    lines.append("")
  for d, dataset in enumerate(("CIFAR-10", "CIFAR-100")):
    lines += [f"Paper, {dataset} (Table {d + 1}):", "",
              "| method | " + " | ".join(PAPER_ARCHITECTURES) + " | Avg. |",
              "|---" * (len(PAPER_ARCHITECTURES) + 2) + "|"]
    for method, values in PAPER_HETEROGENEOUS.items():
      avg = PAPER_LINEAR[{v: k for k, v in HETERO_PAPER_ROW.items()}[method]][d] if (
          method in HETERO_PAPER_ROW.values()) else round(sum(values[d]) / 4, 2)
      lines.append(f"| {method} | " + " | ".join(f"{v:.2f}" for v in values[d]) +
                   f" | {avg:.2f} |")
    lines.append("")
  return "\n".join(lines)


def _base(**fields) -> ExperimentConfig:
  """What every row shares: BYOL clients, all in every round, an IID split, SGD with momentum at the
  paper's 0.032, BYOL's target EMA 0.99, the aggregate as the new global model."""
  return ExperimentConfig(**{
      "method": "fedbyol", "ssl": "byol", "partition": "dirichlet", "alpha": 1000.0,
      "client_optimizer": "sgdm", "client_learning_rate": 0.032, "target_decay": 0.99,
      "server_optimizer": "sgd", "server_learning_rate": 1.0, "server_lr_schedule": "constant",
      "simulation": "reference", "eval_label_fraction": 1.0, "seed": 0, **fields})


def _rows(base: ExperimentConfig, homogeneous: dict, heterogeneous: dict,
          hetero_curve_every: int = 0) -> tuple[Row, ...]:
  rows = [Row(key, name, dataclasses.replace(base, **homogeneous, **fields))
          for key, name, fields in HOMOGENEOUS]
  for key, name, fields in HETEROGENEOUS:
    config = dataclasses.replace(base, **{**homogeneous, **heterogeneous, **fields})
    rows.append(Row(key, name, config, curve_every=hetero_curve_every))
  return tuple(rows)


def _table(scale: str, rows, columns, curve_every: int, paper_columns, notes) -> Table:
  paper = {("linear_100", row, column.key): values[p]
           for row, values in PAPER_LINEAR.items() for column, p in zip(columns, paper_columns)}
  return Table(
      name=NAME, scale=scale, title=TITLE, rows=rows, columns=columns, evaluations=EVALUATIONS,
      paper=paper, curve_every=curve_every, selection_column=columns[0].key, supervised_epochs=0,
      notes=notes, claims=claims(rows), column_heading="dataset (IID)",
      appendix=heterogeneous_appendix, gate_evaluations=TUNED_GATE, cell_baselines=heterogeneous_baselines)


def paper() -> Table:
  base = _base(dataset="cifar10", encoder="resnet18", rounds=100, local_steps=5,
               local_batch_size=500, samples_per_client=10000, projector=(4096, 256),
               predictor=(4096, 256), crop_min_scale=0.08, blur=True, checkpoint_every=10,
               log_every=10)
  rows = _rows(base, {"num_clients": 5, "clients_per_round": 5},
               {"num_clients": 4, "clients_per_round": 4, "samples_per_client": 12500,
                "architectures": ("resnet18", "vgg9", "alexnet", "resnet34"),
                "projector": (256,)})
  columns = (Column("cifar10", "CIFAR-10", overrides=(("dataset", "cifar10"),), title="IID"),
             Column("cifar100", "CIFAR-100", overrides=(("dataset", "cifar100"),),
                    title="IID"))
  return _table("paper", rows, columns, curve_every=25, paper_columns=(0, 1), notes=(
      "Paper scale: built for a GPU (ResNet-18, 100 rounds of 5 clients x 5 epochs of 10,000 "
      "images; heterogeneous: 4 clients x 12,500 images).",))


# The mini regime (issue 31), as the FedEMA mini table's (`tasks/fedema_table3.py`): shifted
# Fashion-MNIST, the gate's ResNet-14 (stride-2 stem, 2 x 2 grid pooling) with BYOL's batch-statistics
# heads, crops >= 50%, client weight decay 5e-4, FedU's threshold from the measured divergence, and the
# FedEMA table's local work: 2 epochs of batch 64 a round (about 63 local steps). Batch 64 over a
# projection of 64 keeps FedFoA's QR well posed (a batch Z of m x n needs m >= n). Batch 128 was tried
# first: FedBYOL, with half the local steps (640 a client over the run), probed +1.4 / +0.0 points over
# raw pixels, below the gate (docs/fedfoa_mini.md). The heterogeneous clients keep their four
# architectures at half width with global pooling (the plain convnets have no grid pooling), on
# 1000 images each: their four models run one after another (no shared batch), and at 2000 images a
# heterogeneous round took 53-60 s, which put the table over its 90 minutes; at 1000, 22 s. For the
# same reason their curve has one point, the last round: each point probes the four encoders, which
# took 110 s (five rounds' training) at rounds 4, 9 and 14.
MINI_SAMPLES_PER_CLIENT = 2000
MINI_HETERO_SAMPLES_PER_CLIENT = 1000
MINI_ROUNDS = 20
MINI_EPOCHS = 2
MINI_BATCH = 64


def mini() -> Table:
  from tasks import fedema_table3  # pylint: disable=g-import-not-at-top
  base = _base(dataset="fashion_mnist_shifted", encoder="resnet14", width=1.0, stem_stride=2,
               pool_grid=2, head_norm="batch", samples_per_client=MINI_SAMPLES_PER_CLIENT,
               rounds=MINI_ROUNDS, local_steps=MINI_EPOCHS, local_batch_size=MINI_BATCH,
               client_weight_decay=fedema_table3.MINI_WEIGHT_DECAY, projector=(512, 64),
               predictor=(512, 64), crop_min_scale=0.5, blur=False,
               fedu_threshold=fedema_table3.MINI_FEDU_THRESHOLD,
               checkpoint_every=MINI_ROUNDS // 2, log_every=1)
  rows = _rows(base, {"num_clients": 5, "clients_per_round": 5},
               {"num_clients": 4, "clients_per_round": 4, "width": 0.5, "pool_grid": 1,
                "samples_per_client": MINI_HETERO_SAMPLES_PER_CLIENT,
                "architectures": ("resnet14", "resnet18", "vgg9", "alexnet"), "projector": (64,)},
               hetero_curve_every=MINI_ROUNDS)
  columns = (Column("fashion_mnist", "Fashion-MNIST (shifted)", title="IID"),)
  return _table("mini", rows, columns, curve_every=MINI_ROUNDS // 4, paper_columns=(0,), notes=(
      f"Mini scale, in the mini regime: shifted Fashion-MNIST, IID, {MINI_SAMPLES_PER_CLIENT} "
      f"images a client, {MINI_ROUNDS} rounds of {MINI_EPOCHS} local epochs of batch {MINI_BATCH}, "
      f"batch-statistics heads, crops >= 50%, client weight decay "
      f"{fedema_table3.MINI_WEIGHT_DECAY:g}; homogeneous: 5 clients, ResNet-14 (stride-2 stem, "
      f"2 x 2 grid pooling); heterogeneous: 4 clients of {MINI_HETERO_SAMPLES_PER_CLIENT} images, "
      f"half-width ResNet-14 / ResNet-18 / VGG-9 / AlexNet with global pooling. The paper's numbers are CIFAR-10's: compare orderings, not "
      f"absolute numbers.",))


SCALES = {"mini": mini, "paper": paper}
