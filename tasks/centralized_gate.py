"""The centralized gate: can each SSL loss, trained on the pooled data in the mini regime, beat raw
pixels under the tuned probe? (`bin/reproduce --table=centralized_gate`; issue 31.)

A federated table tests a paper's ordering only where its rows clear the baselines; a loss that cannot
clear them even centralized cannot do so federated. Each row is centralized pretraining of one SSL
loss with GroupNorm heads (`--head_norm=group`, every table's former heads) or the loss's published
batch-statistics heads (`--head_norm=batch`), on the mini regime's encoder (ResNet-14, stride-2 stem,
2 x 2 grid pooling: 256 features; crops >= 50%; batch 128; Adam 5e-3 with cosine decay), for the
same number of steps.

  BYOL      projector 512-128, predictor 512-128, target EMA 0.99
  SimSiam   projector 512-512-128, predictor 512-128
  SimCLR    projector 128-128-64, temperature 0.1 (the DCCO mini table's contrastive rows)
  MoCo v2   projector 512-128, temperature 0.2, a queue of 4,096 keys (60,000 images: a key leaves
            the queue 32 steps after it entered, long before its image comes back), momentum 0.99
  MoCo v3   projector 512-512-128, predictor 512-128, temperature 0.2, momentum 0.99
  CCO       projector 512-512-512, lambda = 2 (the DCCO mini table's centralized CCO)

The main probe is the tuned one (`evaluation.TunedLinearProbeConfig`: standardized features, L2
chosen on a held-out fifth of the labeled subset), at two label-subset seeds; a row passes the gate
when it is >= 1 point above raw pixels at both and >= 10 above random init at both. The tables' LARS
probe is reported beside it. The testbed is a setting: `--set dataset=fashion_mnist_shifted` runs the
same grid on the shifted images (`tff_ssl.data.sources`).
"""

from __future__ import annotations

import dataclasses

from tff_ssl import evaluation, tables
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.tables import Column, Evaluation, Row, Table

NAME = "centralized_gate"
TITLE = "The centralized gate: every SSL loss, group or batch heads, vs raw pixels (tuned probe)"

EVALUATIONS = tables.TUNED_10_TWO_SEEDS + tables.TUNED_1_TWO_SEEDS + (
    Evaluation("linear_10", "Linear probe, 10% labels (the LARS probe: 1000 steps)",
               evaluation.LinearProbeConfig(label_fraction=0.1, steps=1000, batch_size=512,
                                            optimizer="lars", learning_rate=2.0)),
)
# The gate reads the main probe at both label seeds.
GATE_EVALUATIONS = tables.TUNED_GATE

# (key, name, fields of the loss).
LOSSES = (
    ("byol", "BYOL", dict(ssl="byol", projector=(512, 128), predictor=(512, 128),
                          target_decay=0.99)),
    ("simsiam", "SimSiam", dict(ssl="simsiam", projector=(512, 512, 128), predictor=(512, 128))),
    ("simclr", "SimCLR", dict(ssl="simclr", projector=(128, 128, 64), temperature=0.1)),
    ("moco", "MoCo v2", dict(ssl="moco", projector=(512, 128), temperature=0.2, moco_queue=4096,
                             target_decay=0.99)),
    ("mocov3", "MoCo v3", dict(ssl="mocov3", projector=(512, 512, 128), predictor=(512, 128),
                               temperature=0.2, target_decay=0.99)),
    ("cco", "CCO", dict(ssl="cco", projector=(512, 512, 512), cco_lambda=2.0)),
)
# `--head_norm=batch` gives each loss its published heads: batch statistics in BYOL's, SimSiam's,
# SimCLR's, MoCo v3's and CCO's; none at all in MoCo v2's (`SSLMethod.batch_heads`).
HEADS = (("group", "GroupNorm heads"), ("batch", "published heads (--head_norm=batch)"))

MINI_STEPS = 1000


def mini() -> Table:
  base = ExperimentConfig(method="centralized", ssl="cco", dataset="fashion_mnist",
                          encoder="resnet14", width=1.0, stem_stride=2, pool_grid=2,
                          crop_min_scale=0.5, blur=False, steps=MINI_STEPS, batch_size=128,
                          optimizer="adam", learning_rate=5e-3, log_every=50, seed=0)
  rows = tuple(Row(f"{key}_{norm}", f"{name}, {heads}",
                   dataclasses.replace(base, head_norm=norm, **fields))
               for key, name, fields in LOSSES for norm, heads in HEADS)
  return Table(
      name=NAME, scale="mini", title=TITLE, rows=rows,
      columns=(Column("pooled", "centralized", title="60,000 images, batch 128"),),
      evaluations=EVALUATIONS, paper={}, curve_every=0, selection_column="pooled",
      supervised_epochs=0, column_heading="pretraining", gate_evaluations=GATE_EVALUATIONS,
      notes=(f"A gate, not a paper table: {MINI_STEPS} steps of batch 128 per row; the steps and "
             "the testbed are settings (`--set steps=N`, `--set dataset=fashion_mnist_shifted`).",))


SCALES = {"mini": mini}
