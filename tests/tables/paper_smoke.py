"""Two checks of a paper-scale table, each at a fraction of a paper-size run's cost.

1. `smoke(table, ...)`: every row's paper config (method, SSL loss, aggregation, optimizers, local
   epochs, evaluations, the table's cells and report) runs two rounds through `reproduce`, on a few
   small mock images, with the encoder's width and the heads' sizes cut by `SHRINK` and a ResNet's
   depth to one block a stage (`SHALLOW`): a paper-size
   ResNet-18 with 4096-wide heads costs a CPU 30-70 s a row in building, sending two copies of 16 M
   weights per client to TFF's worker and back, and evaluating, none of which the smoke run checks.
2. `paper_model(config, image_shape)`: the one true paper-size check of a table: its model built at
   paper size (parameter count) and its TFF process built over it (the types the rounds exchange),
   not trained.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tff_ssl import evaluation
from tff_ssl import runner
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.tables import Table

SHRINK = 16  # The heads' widths are divided by it; the encoder's width multiplier by half of it.
SMOKE_IMAGE_SIZE = 8  # Mock CIFAR images of 8 x 8 x 3 (the paper's 32 x 32 at 1/16 of the compute).

# The paper's ResNet-18 (CIFAR stem: 3x3 convolution, no max-pool) without its classifier: 11,168,832
# weights, the count of the CIFAR ResNet-18 in the papers' code (11,173,962 with a 10-class layer)
# less 5,130. GroupNorm has BatchNorm's two weights a channel, Weight Standardization none.
RESNET18_PARAMS = 11_168_832


def head_params(inputs: int, sizes) -> int:
  """Weights of an MLP head (tff_ssl/models/heads.py): a hidden layer of width w holds its kernel
  and 2·w more (GroupNorm's scale and offset), the last layer its kernel and a bias."""
  total, width = 0, inputs
  for i, out in enumerate(sizes):
    total += width * out + (2 * out if i < len(sizes) - 1 else out)
    width = out
  return total


# A ResNet's depth in the smoke runs: one block a stage (what a row's code does with its encoder does
# not depend on its depth; building and tracing cost grow with it). ResNet-34 keeps a depth of its
# own among a heterogeneous row's architectures, which are told apart by name.
SHALLOW = {"resnet14": "resnet8", "resnet18": "resnet10", "resnet34": "resnet18"}


def _shrunk(sizes: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(max(8, s // SHRINK) for s in sizes)


def smoke(table: Table, capped: bool = True, **fields) -> Table:
  """`table` capped at 2 rounds (steps, local epochs, probe steps; `capped`=False: a table whose
  runs the caller stops after 2 rounds itself), each row's encoder width divided by SHRINK / 2 and
  heads by SHRINK, and `fields` (e.g. the clients' sizes) set in every row: the paper's settings
  otherwise."""
  table = table.capped(2) if capped else table
  rows = []
  for row in table.rows:
    c = row.config
    shrink = {"width": c.width / (SHRINK // 2), "projector": _shrunk(c.projector),
              "predictor": _shrunk(c.predictor), "encoder": SHALLOW.get(c.encoder, c.encoder)}
    if c.architectures:
      shrink["architectures"] = tuple(SHALLOW.get(a, a) for a in c.architectures)
    rows.append(dataclasses.replace(row, config=dataclasses.replace(c, **shrink, **fields)))
  columns = tuple(dataclasses.replace(c, overrides=tuple(
      (k, _shrunk(v) if k in ("projector", "predictor") else v) for k, v in c.overrides))
                  for c in table.columns)  # A column may set the heads (L-DAWA's per SSL loss).
  # The mock data has a few images a class: the tuned probe reads all of their labels (at 10% it
  # would hold out too few to fit on).
  evaluations = tuple(
      dataclasses.replace(e, protocol=dataclasses.replace(e.protocol, label_fraction=1.0))
      if isinstance(e.protocol, evaluation.TunedLinearProbeConfig) else e
      for e in table.evaluations)
  return dataclasses.replace(table, rows=tuple(rows), columns=columns, evaluations=evaluations)


def paper_model(config, image_shape, *, auxiliary=None):
  """(the SSL model at paper size, its parameter count, the TFF process over it), built, not
  trained."""
  model = FunctionalModel(runner.ssl_model_builder(config, image_shape))
  params = sum(int(np.prod(w.shape)) for w in model.initial_weights)
  return model, params, runner.build_process(config, model, image_shape, auxiliary)
