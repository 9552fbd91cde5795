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
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.tables import TUNED_10_TWO_SEEDS, TUNED_GATE, Claim, Row, Table

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


# This table's claims (not a paper's: issue 36's extension of DCCO, issue 52's one computation).
EXACT = ("not the paper's: this project's (issue 36); DCCO's round is the centralized step on the "
         "union of the round's images for any statistics loss (tests/methods/"
         "test_dcco_statistics.py), so each DCCO row should be as near its centralized row as "
         "DCCO Table 1 finds DCCO to centralized CCO (footnote 3: \"close\", within 3 points here)")
STALE = ("not the paper's (it names one communication round as an open question): one-computation "
         "DCCO should cost at most 1 point against two-phase DCCO (issue 52)")


def claims(rows) -> tuple[Claim, ...]:
  """Each federated row within WITHIN points of its centralized row; one-computation DCCO within a
  point of two-phase DCCO; between the rows the table has."""
  keys = {r.key for r in rows}
  out = [Claim(fed, central, EXACT, relation="within", within=WITHIN, own=True)
         for fed, central in CENTRALIZED.items() if {fed, central} <= keys]
  if {"dcco", "dcco_previous"} <= keys:
    out.append(Claim("dcco_previous", "dcco", STALE, relation="within", within=1.0, own=True))
  return tuple(out)


def _table(scale: str, base: ExperimentConfig, rounds: int, num_images: int, global_batch: int,
           notes: tuple[str, ...], evaluations, gate) -> Table:
  columns = tuple(c for c in dcco_table1.columns(num_images, global_batch) if c.key in COLUMNS)
  rows = _rows(base, rounds, columns[0].global_batch)
  return Table(
      name=NAME, scale=scale, title=TITLE, rows=rows, columns=columns, evaluations=evaluations,
      paper={}, curve_every=0, selection_column=COLUMNS[-1], supervised_epochs=0, notes=notes,
      claims=claims(rows), gate_evaluations=gate)


def mini() -> Table:
  base = ExperimentConfig(method="dcco", dataset=MINI_DATASET, encoder="resnet14", width=1.0,
                          stem_stride=2, pool_grid=2, crop_min_scale=0.5, blur=False, cco_lambda=2.0,
                          projector=(512, 512, 512), server_learning_rate=5e-3,
                          checkpoint_every=250, log_every=50, seed=0)
  return _table("mini", base, MINI_ROUNDS, 60_000, 128, notes=(
      f"Mini scale, in the mini regime (shifted Fashion-MNIST): {MINI_ROUNDS} rounds of 128 images "
      f"(the centralized gate's length); server Adam 5e-3 for every loss.",
      "One-computation DCCO is the plain one-phase round: no remedy of issue 52 (mean or variance "
      "anchor, a two-phase refresh every 2 or 4 rounds) fixed it on validation pilots, so none is "
      "the row's (docs/dcco_statistics_mini.md gives the measured reason). Best point reached: at "
      "server Adam 1e-3 (a diagnostic, non-IID 1: docs/table_runs/dcco_statistics_mini_lr1e-3/), "
      "59.2 / 58.8 against two-phase DCCO's 71.9 / 71.9 at that rate.",),
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
