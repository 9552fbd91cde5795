#!/usr/bin/env python3
"""The baselines a table's encoders must beat, under the LARS probe and the tuned probe, at several
label fractions and label-subset seeds: raw pixels and the table's encoder at its initialization.
Writes nothing; prints a Markdown table (docs/mini_regime.md, "Choosing the mini regime"; issue 31).

  .venv/bin/python tools/probe_baselines.py --table=dcco_table1 --scale=mini \
      --label_fractions=0.1,0.01 --seeds=0,1 [--dataset=fashion_mnist_shifted]
"""

import dataclasses
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_ssl import runtime  # noqa: E402

runtime.install()  # Before TFF is imported: no orphan worker on any exit path.

import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import tasks  # noqa: E402
from tff_ssl import cli, evaluation, experiment  # noqa: E402

_TABLE = flags.DEFINE_enum("table", "dcco_table1", sorted(tasks.TABLES), "The table whose encoder "
                           "(its first pretraining row's) and data are used.")
_SCALE = flags.DEFINE_enum("scale", "mini", ["mini", "paper"], "The table's scale.")
_FRACTIONS = flags.DEFINE_list("label_fractions", ["0.1", "0.01"], "Labeled fractions of train.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "Label-subset seeds.")
_DATASET = flags.DEFINE_string("dataset", None, "Another image source of the same shape (default: "
                               "the table's), e.g. fashion_mnist_shifted.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  with cli.one_line_errors("rerun the same command"):
    fractions = [float(f) for f in _FRACTIONS.value]
    seeds = [int(s) for s in _SEEDS.value]
    table = tasks.get_table(_TABLE.value, _SCALE.value)
    config = table.cell_config(next(r for r in table.rows if not r.supervised), None)
    if _DATASET.value:
      config = dataclasses.replace(config, dataset=_DATASET.value)
    train, test = experiment.load_splits(config)
    tf.keras.utils.set_random_seed(config.seed)
    encoders = {"raw pixels": evaluation.raw_pixels(train.image_shape),
                f"random init ({config.encoder})": config.build_encoder(train.image_shape)}
    print(f"{_TABLE.value} ({_SCALE.value}): {config.dataset}, {len(train)} train / {len(test)} "
          f"test images\n")
    print("| baseline | labels | seed | LARS probe (1000 steps) | tuned probe | tuned: L2 chosen "
          "| seconds (LARS / tuned) |")
    print("|---|---|---|---|---|---|---|")
    for name, encoder in encoders.items():
      for fraction in fractions:
        for seed in seeds:
          start = time.perf_counter()
          lars = evaluation.linear_probe(encoder, train, test, evaluation.LinearProbeConfig(
              label_fraction=fraction, seed=seed))
          middle = time.perf_counter()
          fit = evaluation.tuned_linear_probe_fit(encoder, train, test,
                                                  evaluation.TunedLinearProbeConfig(
                                                      label_fraction=fraction, seed=seed))
          end = time.perf_counter()
          print(f"| {name} | {fraction:.0%} | {seed} | {100 * lars:.1f} | "
                f"{100 * fit.test_accuracy:.1f} | {fit.l2:g} | {middle - start:.0f} / "
                f"{end - middle:.0f} |", flush=True)
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
