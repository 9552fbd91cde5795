"""Statistics losses: DCCO of CCO, VICReg and the spectral contrastive loss, and one-computation DCCO.

`bin/reproduce --table=dcco_statistics --scale=mini` (2 CPU cores) or `--scale=paper` (a GPU).

DCCO trains any loss of means over images with exactly the centralized gradient (issue 36,
`tff_ssl.losses.STATISTICS`). Each federated row stands beside its centralized counterpart (one step of
the round's number of images per round: at one image per client and one local step the same algorithm);
one-computation DCCO (`--dcco_statistics=previous`, statistics one round stale) beside two-phase DCCO.

Rows:
  dcco                  DCCO, CCO (two phases)                                      DCCO Table 1's row
  dcco_previous         DCCO, CCO, one phase against the previous round's statistics
  dcco_vicreg           DCCO, VICReg (Bardes et al., 2022; lambda = mu = 25, nu = 1, the paper's)
  dcco_spectral         DCCO, the spectral contrastive loss (HaoChen et al., 2021; FedSC's objective)
  centralized_cco, centralized_vicreg, centralized_spectral: the same losses on pooled data
Columns: DCCO Table 1's non-IID 1 (every client one image) and non-IID 16 (one class per client, 16
  images each), at its global batch (mini: 128 a round, 128 and 8 clients; paper: 512).

  mini   the mini regime on shifted Fashion-MNIST (docs/mini_regime.md; the privacy table's base):
         ResNet-14 (stride-2 stem, 2 x 2 grid pooling), projector [512]*3, crops >= 50%, CCO's lambda
         = 2; MINI_ROUNDS rounds (the centralized gate's length), server Adam 5e-3 with cosine decay
         (the DCCO table's choice), centralized Adam 5e-3. One learning rate for every loss: Adam's
         step does not depend on the loss's scale. Main probe: the tuned probe at 10% of the labels,
         two label seeds, and the gate.
  paper  CIFAR-100, DCCO Table 1's paper settings (100K rounds, projector [1024]*3, lambda = 20): for
         a GPU.
"""

from __future__ import annotations

import dataclasses

from tasks import dcco_table1
from tff_ssl import table_report
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.tables import TUNED_10_TWO_SEEDS, TUNED_GATE, Row, Table

NAME = "dcco_statistics"
TITLE = "Statistics losses: DCCO of CCO, VICReg and spectral, and one-computation DCCO"

COLUMNS = ("noniid_1", "noniid_16")
# Each federated row's centralized counterpart.
CENTRALIZED = {"dcco": "centralized_cco", "dcco_previous": "centralized_cco",
               "dcco_vicreg": "centralized_vicreg", "dcco_spectral": "centralized_spectral"}
WITHIN = 3.0  # Points: DCCO Table 1's check of DCCO against centralized CCO.

MINI_ROUNDS = 1000
MINI_DATASET = "fashion_mnist_shifted"


def _rows(base: ExperimentConfig, rounds: int, global_batch: int) -> tuple[Row, ...]:
  fed = dataclasses.replace(base, method="dcco", rounds=rounds, local_steps=1,
                            client_optimizer="sgd", client_learning_rate=1.0,
                            server_optimizer="adam")
  central = dataclasses.replace(base, method="centralized", steps=rounds, batch_size=global_batch,
                                optimizer="adam", learning_rate=base.server_learning_rate)
  return (
      Row("dcco", "DCCO (CCO)", dataclasses.replace(fed, ssl="cco")),
      Row("dcco_previous", "One-computation DCCO (CCO, previous statistics)",
          dataclasses.replace(fed, ssl="cco", dcco_statistics="previous")),
      Row("dcco_vicreg", "DCCO-VICReg", dataclasses.replace(fed, ssl="vicreg")),
      Row("dcco_spectral", "DCCO-spectral", dataclasses.replace(fed, ssl="spectral")),
      Row("centralized_cco", "Centralized CCO", dataclasses.replace(central, ssl="cco")),
      Row("centralized_vicreg", "Centralized VICReg", dataclasses.replace(central, ssl="vicreg")),
      Row("centralized_spectral", "Centralized spectral",
          dataclasses.replace(central, ssl="spectral")),
  )


def checks(table: Table, records, gate: table_report.Gate) -> list[str]:
  """Each federated row against its centralized row (within WITHIN points, gated), and the cost of
  stale statistics (one-computation minus two-phase DCCO, points, gated), at the main probe's label
  seeds."""
  ours = {(r["evaluation"], r["row"], r["column"]): r["ours"] for r in records}
  keys = gate.evaluations
  rows = {r.key for r in table.rows}
  lines = []
  for fed, central in CENTRALIZED.items():
    if not {fed, central} <= rows:
      continue
    for column in (c.key for c in table.columns):
      a = [ours.get((k, fed, column)) for k in keys]
      b = [ours.get((k, central, "")) for k in keys]
      if not all(isinstance(v, float) for v in a + b):
        continue
      gaps = [100 * (y - x) for x, y in zip(a, b)]
      label = table.column(column).group + " " + table.column(column).label
      text = (f"{label}: {table.row(central).name} − {table.row(fed).name} = "
              f"{' / '.join(f'{g:+.1f}' for g in gaps)} points, within {WITHIN:g}")
      lines.append(gate.ordering(text, [(fed, column), (central, "")],
                                 all(abs(g) <= WITHIN for g in gaps)))
  if {"dcco", "dcco_previous"} <= rows:
    for column in (c.key for c in table.columns):
      line = gate.compare(table, records, "dcco_previous", "dcco", column, strict=False,
                          label=f"stale statistics, {table.column(column).label}", within=1.0)
      if line:
        lines.append(line)
  return lines


def _table(scale: str, base: ExperimentConfig, rounds: int, num_images: int, global_batch: int,
           notes: tuple[str, ...], evaluations, gate) -> Table:
  columns = tuple(c for c in dcco_table1.columns(num_images, global_batch) if c.key in COLUMNS)
  return Table(
      name=NAME, scale=scale, title=TITLE, rows=_rows(base, rounds, columns[0].global_batch),
      columns=columns, evaluations=evaluations, paper={}, curve_every=0,
      selection_column=COLUMNS[-1], supervised_epochs=0, notes=notes, checks=checks,
      gate_evaluations=gate)


def mini() -> Table:
  base = ExperimentConfig(method="dcco", dataset=MINI_DATASET, encoder="resnet14", width=1.0,
                          stem_stride=2, pool_grid=2, crop_min_scale=0.5, blur=False, cco_lambda=2.0,
                          projector=(512, 512, 512), server_learning_rate=5e-3,
                          checkpoint_every=250, log_every=50, seed=0)
  return _table("mini", base, MINI_ROUNDS, 60_000, 128, notes=(
      f"Mini scale, in the mini regime (shifted Fashion-MNIST): {MINI_ROUNDS} rounds of 128 images "
      f"(the centralized gate's length); server Adam 5e-3 for every loss.",),
      evaluations=TUNED_10_TWO_SEEDS, gate=TUNED_GATE)


def paper() -> Table:
  base = ExperimentConfig(method="dcco", dataset="cifar100", encoder="resnet14", width=1.0,
                          crop_min_scale=0.08, blur=False, cco_lambda=20.0,
                          projector=(1024, 1024, 1024), server_learning_rate=5e-3,
                          checkpoint_every=1000, log_every=100, seed=0)
  return _table("paper", base, 100_000, 50_000, 512, notes=(
      "Paper scale: DCCO Table 1's CIFAR-100 settings, built for a GPU.",),
      evaluations=dcco_table1.EVALUATIONS[:1], gate=())


SCALES = {"mini": mini, "paper": paper}
