#!/usr/bin/env python3
"""The centralized gate on several testbeds, side by side (docs/mini_regime.md, "The centralized gate").
Reads `bin/reproduce --table=centralized_gate` output folders (one per testbed: their table.csv, with
the raw-pixel and random-init rows); writes nothing; prints a Markdown table: each row's tuned probe at
10% labels (label seeds 0 / 1), its margins over raw pixels, and whether it passes the gate, per testbed.

  .venv/bin/python tools/gate_summary.py runs/gate_fmnist runs/gate_shifted
  .venv/bin/python tools/gate_summary.py --labels=1 runs/gate_fmnist runs/gate_shifted  # at 1%
"""

import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tff_ssl.tables import TUNED_GATE  # noqa: E402
from tff_ssl import table_report  # noqa: E402

GATE = TUNED_GATE  # --labels=1: ("tuned_1_s0", "tuned_1_s1").
# The gate's rule in points (table.csv holds percentages).
OVER_RAW, OVER_RANDOM, GOAL = (100 * table_report.GATE_OVER_RAW_PIXELS,
                               100 * table_report.GATE_OVER_RANDOM_INIT,
                               100 * table_report.GOAL_OVER_RAW_PIXELS)


def read(folder: str) -> tuple[dict, dict]:
  """({row: {evaluation: percent}}, {baseline row: {evaluation: percent}}) of a table.csv."""
  path = os.path.join(folder, "table.csv")
  if not os.path.exists(path):
    raise SystemExit(f"{folder} has no table.csv; pass bin/reproduce --table=centralized_gate "
                     f"output folders")
  rows, baselines = {}, {}
  with open(path) as f:
    for rec in csv.DictReader(f):
      if rec["ours"] == "":
        continue
      target = baselines if rec["row"] in ("raw_pixels", "random_init") else rows
      target.setdefault(rec["row"], {})[rec["evaluation"]] = float(rec["ours"])
  return rows, baselines


def verdict(margins_raw, margins_random) -> str:
  eps = 1e-6  # As table_report's gate: a margin at the bound passes.
  if min(margins_raw) >= OVER_RAW - eps and min(margins_random) >= OVER_RANDOM - eps:
    return "passes" + (", goal" if min(margins_raw) >= GOAL - eps else "")
  return "**fails**"


def main(folders) -> None:
  global GATE
  if folders and folders[0].startswith("--labels="):
    percent = folders.pop(0).split("=", 1)[1]
    GATE = (f"tuned_{percent}_s0", f"tuned_{percent}_s1")
  tables = [(os.path.basename(os.path.normpath(f)), *read(f)) for f in folders]
  keys = list(dict.fromkeys(k for _, rows, _ in tables for k in rows))
  header = "| row | " + " | ".join(
      f"{name}: {GATE[0].split('_')[0]} {GATE[0].split('_')[1]}% (seeds 0 / 1) | over raw pixels | "
      f"gate" for name, _, _ in tables) + " |"
  print(header)
  print("|---" * (1 + 3 * len(tables)) + "|")
  for base in ("raw_pixels", "random_init"):
    cells = []
    for _, _, baselines in tables:
      b = baselines.get(base, {})
      cells += [" / ".join(f"{b[k]:.1f}" for k in GATE if k in b), "", ""]
    print(f"| *{base.replace('_', ' ')}* | " + " | ".join(cells) + " |")
  for key in keys:
    cells = []
    for _, rows, baselines in tables:
      r = rows.get(key)
      if r is None or any(k not in r for k in GATE):
        cells += ["not run", "", ""]
        continue
      raw = [r[k] - baselines["raw_pixels"][k] for k in GATE]
      rnd = [r[k] - baselines["random_init"][k] for k in GATE]
      cells += [" / ".join(f"{r[k]:.1f}" for k in GATE), " / ".join(f"{m:+.1f}" for m in raw),
                verdict(raw, rnd)]
    print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  if len(sys.argv) < 2:
    raise SystemExit("usage: tools/gate_summary.py GATE_OUTPUT_DIR [GATE_OUTPUT_DIR ...]")
  main(sys.argv[1:])
