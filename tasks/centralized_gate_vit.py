"""The centralized ViT gate: can MoCo v3 train `vit_mini` on the pooled data so that its features
beat raw pixels under the tuned probe? (`bin/reproduce --table=centralized_gate_vit`; issue 33.)

The LW-FedSSL table's rows are federated MoCo v3 on this ViT; they can clear the baselines only if
centralized training of the same encoder with the same recipe does. Each row is centralized MoCo v3
with MoCo v3's ViT recipe (`tff_ssl.ssl.mocov3.vit_recipe`: AdamW with weight decay 0.1, a linear
warm-up over the first tenth of the steps then cosine decay, batch-statistics heads; the patch
projection trained, as LW-FedSSL trains it), crops >= 50%, batch 128, peak learning rate 1e-3, 3000
steps, heads 256-256-64 / 256-64 (the LW-FedSSL mini table's), temperature 0.2, momentum 0.99, on
vit_mini (6 blocks, dim 96, 3 heads) with patch 7 on the 28 x 28 images (16 tokens). The rows are the
issue's levers, in the order it tries them:

  cls         the class token's features (the encoder as LW-FedSSL builds it)
  mean        the mean of the patch tokens' features (no class token)
  mean_frozen + the patch projection frozen at its initialization (MoCo v3's stability trick)
  mean_w192   mean + width 192 (the ViT-Tiny's)
  mean_d8     mean + 8 blocks instead of 6 (width 96)
  mean_p4     mean + patch 4 (49 tokens; width 96, 6 blocks)

A row whose encoder differs from the first row's is gated against its own random initialization
(`reproduce.encoder_baselines`). The steps and the testbed are settings (`--set steps=N`,
`--set dataset=fashion_mnist_shifted`).
"""

from __future__ import annotations

import dataclasses

from tasks import centralized_gate
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.ssl import mocov3
from tff_ssl.tables import Column, Row, Table

NAME = "centralized_gate_vit"
TITLE = "The centralized ViT gate: MoCo v3's recipe on vit_mini vs raw pixels (tuned probe)"

MINI_STEPS = 3000
LEARNING_RATE = 1e-3

# (key, name, fields on top of the base config).
LEVERS = (
    ("cls", "MoCo v3, class token", {"readout": "cls"}),
    ("mean", "MoCo v3, mean token", {"readout": "mean"}),
    ("mean_frozen", "MoCo v3, mean token, frozen patch projection",
     {"readout": "mean", "freeze_patch_embed": True}),
    ("mean_w192", "MoCo v3, mean token, width 192", {"readout": "mean", "width": 2.0}),
    ("mean_d8", "MoCo v3, mean token, 8 blocks", {"readout": "mean", "depth": 8}),
    ("mean_p4", "MoCo v3, mean token, patch 4", {"readout": "mean", "patch_size": 4}),
)


def base_config(**fields) -> ExperimentConfig:
  """Centralized MoCo v3 on vit_mini with MoCo v3's ViT recipe (the module docstring)."""
  return ExperimentConfig(**{
      "method": "centralized", "dataset": "fashion_mnist", "encoder": "vit_mini", "patch_size": 7,
      "crop_min_scale": 0.5, "blur": False, "steps": MINI_STEPS, "batch_size": 128,
      "learning_rate": LEARNING_RATE, "projector": (256, 256, 64), "predictor": (256, 64),
      "temperature": 0.2, "target_decay": 0.99, "log_every": 50, "seed": 0,
      **mocov3.vit_recipe(federated=False), **fields})


def mini() -> Table:
  rows = tuple(Row(key, name, base_config(**fields)) for key, name, fields in LEVERS)
  return Table(
      name=NAME, scale="mini", title=TITLE, rows=rows,
      columns=(Column("pooled", "centralized", title="60,000 images, batch 128"),),
      evaluations=centralized_gate.EVALUATIONS, paper={}, curve_every=0,
      selection_column="pooled", supervised_epochs=0, column_heading="pretraining",
      gate_evaluations=centralized_gate.GATE_EVALUATIONS,
      notes=(f"A gate, not a paper table: {MINI_STEPS} steps of batch 128 per row; each row is one "
             "of the levers (tasks/centralized_gate_vit.py); the steps and "
             "the testbed are settings (`--set steps=N`, `--set dataset=fashion_mnist_shifted`).",))


def row_config(key: str, **fields) -> ExperimentConfig:
  """The config of lever row `key` (the LW-FedSSL table reads the readout that passed)."""
  return dataclasses.replace(base_config(**dict(next(f for k, _, f in LEVERS if k == key))),
                             **fields)


SCALES = {"mini": mini}
