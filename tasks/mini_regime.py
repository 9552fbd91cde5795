"""Why does centralized CCO stop at ~65% on mini Fashion-MNIST, below a linear classifier on raw pixels?

A study, run as a table of centralized pretraining rows (`bin/reproduce --table=mini_regime`): each
row changes one thing of the DCCO mini table's former centralized CCO (ResNet-14 with a stride-2 stem, global
average pooling to 64 features, projector 512-512-512, lambda = 20, batch 128, Adam 5e-3 with cosine
decay, crops of at least 20%, 200 steps) and reports the same linear probe (10% of the labels,
standardized features, LARS 1000 steps), beside the raw-pixel and random-init rows; a longer probe
(3000 steps) tells whether the probe's budget is what stops it. The centralized contrastive rows
(SimCLR, projector 128-128-64, temperature 0.1) are the second method the regime must serve.

docs/mini_regime.md ("Choosing the mini regime") reports the numbers and what was chosen from them: the
rows `cco_grid2_lambda2_crop50_3000` and `simclr_grid2_crop50_3000` are the DCCO mini table's
centralized rows now (`tasks/dcco_table1.py`).
"""

from __future__ import annotations

import dataclasses

from tff_ssl import evaluation
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.tables import Column, Evaluation, Row, Table

NAME = "mini_regime"
TITLE = "Mini regime study: centralized CCO and contrastive pretraining vs raw pixels"

EVALUATIONS = (
    Evaluation("linear_10", "Linear probe, 10% labels (the tables' probe: LARS, 1000 steps)",
               evaluation.LinearProbeConfig(label_fraction=0.1, steps=1000, batch_size=512,
                                            optimizer="lars", learning_rate=2.0)),
    Evaluation("linear_10_long", "Linear probe, 10% labels, 3000 steps",
               evaluation.LinearProbeConfig(label_fraction=0.1, steps=3000, batch_size=512,
                                            optimizer="lars", learning_rate=2.0)),
)

# (key, name, fields changed from the DCCO mini table's centralized CCO).
_CCO = (
    ("cco", "CCO as in the DCCO mini table (200 steps)", {}),
    ("cco_600", "CCO, 600 steps", {"steps": 600}),
    ("cco_2000", "CCO, 2000 steps", {"steps": 2000}),
    ("cco_lr", "CCO, 600 steps, learning rate 1e-3", {"steps": 600, "learning_rate": 1e-3}),
    ("cco_proj128", "CCO, 600 steps, projector 128-128-128 (narrower than the batch)",
     {"steps": 600, "projector": (128, 128, 128)}),
    ("cco_lambda5", "CCO, 600 steps, lambda = 5", {"steps": 600, "cco_lambda": 5.0}),
    ("cco_lambda2", "CCO, 600 steps, lambda = 2", {"steps": 600, "cco_lambda": 2.0}),
    ("cco_batch256", "CCO, 600 steps, batch 256", {"steps": 600, "batch_size": 256}),
    ("cco_width2", "CCO, 600 steps, encoder width x2 (128 features)", {"steps": 600, "width": 2.0}),
    ("cco_grid2", "CCO, 600 steps, 2 x 2 grid pooling (256 features)",
     {"steps": 600, "pool_grid": 2}),
    ("cco_grid2_lambda2_2000", "CCO, 2000 steps, 2 x 2 grid pooling, lambda = 2",
     {"steps": 2000, "pool_grid": 2, "cco_lambda": 2.0}),
    ("cco_grid2_lambda2_crop50", "CCO, 600 steps, 2 x 2 grid pooling, lambda = 2, crops >= 50%",
     {"steps": 600, "pool_grid": 2, "cco_lambda": 2.0, "crop_min_scale": 0.5}),
    ("cco_grid2_lambda2_crop50_2000", "CCO, 2000 steps, 2 x 2 grid pooling, lambda = 2, crops >= 50%",
     {"steps": 2000, "pool_grid": 2, "cco_lambda": 2.0, "crop_min_scale": 0.5}),
    ("cco_grid2_lambda2_crop50_3000", "CCO, 3000 steps, 2 x 2 grid pooling, lambda = 2, crops >= 50%",
     {"steps": 3000, "pool_grid": 2, "cco_lambda": 2.0, "crop_min_scale": 0.5}),
)
_CONTRASTIVE = (
    ("simclr", "Contrastive (SimCLR), 200 steps", {}),
    ("simclr_2000", "Contrastive, 2000 steps", {"steps": 2000}),
    ("simclr_grid2_2000", "Contrastive, 2000 steps, 2 x 2 grid pooling", {"steps": 2000,
                                                                          "pool_grid": 2}),
    ("simclr_grid2_crop50_2000", "Contrastive, 2000 steps, 2 x 2 grid pooling, crops >= 50%",
     {"steps": 2000, "pool_grid": 2, "crop_min_scale": 0.5}),
    ("simclr_grid2_crop50_3000", "Contrastive, 3000 steps, 2 x 2 grid pooling, crops >= 50%",
     {"steps": 3000, "pool_grid": 2, "crop_min_scale": 0.5}),
)


def mini() -> Table:
  base = ExperimentConfig(method="centralized", ssl="cco", dataset="fashion_mnist", encoder="resnet14",
                          width=1.0, stem_stride=2, crop_min_scale=0.2, blur=False, cco_lambda=20.0,
                          projector=(512, 512, 512), steps=200, batch_size=128, optimizer="adam",
                          learning_rate=5e-3, log_every=50, seed=0)
  contrastive = dataclasses.replace(base, ssl="simclr", projector=(128, 128, 64), temperature=0.1)
  rows = tuple(Row(key, name, dataclasses.replace(base, **fields)) for key, name, fields in _CCO)
  rows += tuple(Row(key, name, dataclasses.replace(contrastive, **fields))
                for key, name, fields in _CONTRASTIVE)
  return Table(
      name=NAME, scale="mini", title=TITLE, rows=rows,
      columns=(Column("pooled", "centralized", title="60,000 images, batch 128"),),
      evaluations=EVALUATIONS, paper={}, curve_every=500, selection_column="pooled",
      supervised_epochs=0, column_heading="pretraining",
      notes=("A study, not a paper table: there are no paper numbers. The random-init row is the "
             "first row's encoder (global pooling); grid pooling's random-init encoder probes "
             "higher (more features).",))


SCALES = {"mini": mini}
