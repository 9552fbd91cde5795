#!/usr/bin/env python3
"""How far each cell's pretrained encoder moved from its initialization, and what its client states
say (docs/results.md, "The mini FedEMA table"; docs/mini_regime.md). Reads a `bin/reproduce` output
folder; writes nothing.

  .venv/bin/python tools/representation_stats.py runs/fedema3-mini

Prints a Markdown table, one line per finished cell and one for the encoder at initialization: on the
first 1,000 test images, the mean pairwise cosine between encoder features and their effective rank
(exp of the entropy of the centered features' normalized squared singular values: how many directions
the features use), the same effective rank of the standardized features (each dimension scaled to
unit variance, as the linear probe sees them) and the largest direction's share of their variance,
the loss in the first and last round and, for cells with stateful clients, the
range over clients of the last stored divergence d, mu and lambda_k (`tff_ssl.methods.fedssl`).
For centralized cells, which save their heads (`heads.npz`), the projections of the same images too:
the per-dimension std of the l2-normalized projections times sqrt(d) (1: spread over every dimension;
0: collapsed to one point, the measure of BYOL's and SimSiam's papers) and their effective rank.
"""

import glob
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_ssl import runtime  # noqa: E402

runtime.install()  # Before TFF is imported: no orphan worker on any exit path.

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tff_ssl import data as data_lib  # noqa: E402
from tff_ssl import experiment  # noqa: E402
from tff_ssl.data.augment import to_float  # noqa: E402
from tff_ssl.federated import client_state  # noqa: E402
from tff_ssl.models.layers import batch_segments  # noqa: E402

NUM_IMAGES = 1000


def _spectrum(centered: np.ndarray) -> np.ndarray:
  s = np.linalg.svd(centered, compute_uv=False)
  return s**2 / np.sum(s**2)


def feature_stats(features: np.ndarray) -> tuple[float, float, float, float]:
  """(mean pairwise cosine, effective rank, effective rank of the standardized features, their
  largest direction's share of the variance) of the rows of `features`."""
  f = np.asarray(features, np.float64)
  unit = f / np.linalg.norm(f, axis=1, keepdims=True)
  cosines = (unit @ unit.T)[~np.eye(len(f), dtype=bool)]
  p = _spectrum(f - f.mean(0))
  z = _spectrum((f - f.mean(0)) / (f.std(0) + 1e-12))
  rank = lambda q: float(np.exp(-np.sum(q * np.log(q + 1e-12))))  # noqa: E731
  return float(cosines.mean()), rank(p), rank(z), float(z.max())


# A SiameseClientState's scalars in its flattened order (tf.nest sorts a dict's keys; the model's
# tensors, none of them scalars, sit between them).
SCALARS = sorted(("rounds", "scale", "divergence", "mu"))


def state_ranges(run: str) -> str:
  """'d a-b, mu a-b, lambda_k a-b' over the clients' newest stored states ('' without client
  states)."""
  root = os.path.join(run, "client_states")
  if not os.path.isdir(root):
    return ""
  store = client_state.DiskClientStateStore(root)
  values = {name: [] for name in SCALARS}
  for cid in store.clients():
    flat = store.read_flat(cid, 2**31)
    scalars = [float(t) for t in flat if np.ndim(t) == 0]
    if len(scalars) != len(SCALARS):
      return ""  # Not a SiameseClientState.
    for name, value in zip(SCALARS, scalars):
      values[name].append(value)
  return ", ".join(f"{label} {min(values[name]):.3g}–{max(values[name]):.3g}"
                   for label, name in (("d", "divergence"), ("μ", "mu"), ("λ_k", "scale")))


def state_history(run: str) -> list[tuple[int, float, float, float, float]]:
  """[(round, min d, max d, min mu, max mu)] over the clients, for each round whose client states
  are still stored (a run keeps those written since its oldest kept checkpoint); [] without client
  states. d and mu are those a client used in the round named (its state at the round's end)."""
  root = os.path.join(run, "client_states")
  if not os.path.isdir(root):
    return []
  store = client_state.DiskClientStateStore(root)
  by_round = {}
  for cid in store.clients():
    seen = set()
    for r in range(int(json.load(open(os.path.join(run, "hparams.json")))["rounds"]) + 1):
      flat = store.read_flat(cid, r)
      scalars = dict(zip(SCALARS, (float(t) for t in flat if np.ndim(t) == 0))) if flat else {}
      if len(scalars) != len(SCALARS) or scalars["rounds"] in seen:
        continue
      seen.add(scalars["rounds"])
      # The first r that reads a new state is its version: written at the end of round r - 1.
      by_round.setdefault(r - 1, []).append(
          (scalars["divergence"], scalars["mu"]))
  return [(r, min(d for d, _ in v), max(d for d, _ in v), min(m for _, m in v),
           max(m for _, m in v)) for r, v in sorted(by_round.items())]


def projection_stats(run: str, config, image_shape, features: tf.Tensor
                     ) -> tuple[float, float] | None:
  """(mean per-dimension std of the l2-normalized projections x sqrt(d), their effective rank) of
  `features` through the run's saved projector; None when the run saved no heads. Batch heads
  normalize over the images given (one batch)."""
  path = os.path.join(run, experiment.HEADS_FILE)
  if not os.path.exists(path):
    return None
  saved = np.load(path)
  model = experiment.centralized_model_builder(config, image_shape)()
  model.projector.set_weights([saved[f"projector_{i}"]
                               for i in range(len(model.projector.get_weights()))])
  with batch_segments(1):
    z = model.projector(features, training=True).numpy().astype(np.float64)
  unit = z / np.linalg.norm(z, axis=1, keepdims=True)
  spread = float(unit.std(axis=0).mean() * np.sqrt(z.shape[1]))
  p = _spectrum(z - z.mean(0))
  return spread, float(np.exp(-np.sum(p * np.log(p + 1e-12))))


def main(out: str) -> None:
  runs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(out, "cells", "*", "*",
                                                                   "results.json")))
  if not runs:
    raise SystemExit(f"{out} has no finished cells (cells/ROW/COLUMN/results.json); pass a "
                     f"bin/reproduce --output_dir")
  print("| cell | mean pairwise cosine | effective rank | standardized: effective rank | "
        "largest share | loss, first round | loss, last round | client states (last) | "
        "projections: std x sqrt(d) | projections: effective rank |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for i, run in enumerate(runs):
    try:
      config, encoder = experiment.load_encoder(run)
    except ValueError as e:  # A heterogeneous run: one encoder per architecture, none global.
      print(f"| {os.path.relpath(run, os.path.join(out, 'cells'))} | not measured: {e} |||||||||")
      continue
    test = data_lib.load(config.dataset, "test", data_dir=config.data_dir)
    x = to_float(test.images[:NUM_IMAGES])
    if i == 0:
      tf.keras.utils.set_random_seed(config.seed)
      cosine, rank, zrank, share = feature_stats(
          config.build_encoder(test.image_shape)(x, training=False))
      print(f"| at initialization | {cosine:.3f} | {rank:.1f} | {zrank:.1f} | {share:.2f} | | | | "
            f"| |")
    features = encoder(x, training=False)
    cosine, rank, zrank, share = feature_stats(features)
    projections = projection_stats(run, config, test.image_shape, features)
    projected = (f"{projections[0]:.3f} | {projections[1]:.1f}" if projections is not None else
                 " | ")
    with open(os.path.join(run, "metrics.csv")) as f:
      losses = [line.split(",")[1] for line in f.read().splitlines()[1:]]
    print(f"| {os.path.relpath(run, os.path.join(out, 'cells'))} | {cosine:.3f} | {rank:.1f} | "
          f"{zrank:.1f} | {share:.2f} | "
          f"{float(losses[0]):.4g} | {float(losses[-1]):.4g} | {state_ranges(run)} | "
          f"{projected} |")
  histories = [(run, state_history(run)) for run in runs]
  # Cells whose method measures no divergence (FedBYOL, FedMoCo) store d = mu = 0: left out.
  histories = [(run, h) for run, h in histories if any(any(v[1:]) for v in h)]
  if histories:
    print("\nThe divergence d = ||W_g - W_k|| and mu each client used, per round still stored "
          "(min-max over the clients):\n")
    print("| cell | " + " | ".join(f"round {r}" for r, *_ in histories[0][1]) + " |")
    print("|---" * (len(histories[0][1]) + 1) + "|")
    for run, history in histories:
      print(f"| {os.path.relpath(run, os.path.join(out, 'cells'))} | " + " | ".join(
          f"d {lo:.2f}–{hi:.2f}, μ {mlo:.2f}–{mhi:.2f}" for _, lo, hi, mlo, mhi in history) + " |")


if __name__ == "__main__":
  if len(sys.argv) != 2:
    raise SystemExit("usage: tools/representation_stats.py BIN_REPRODUCE_OUTPUT_DIR")
  main(sys.argv[1])
