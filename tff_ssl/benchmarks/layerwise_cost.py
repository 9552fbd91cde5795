"""What a client pays per stage of layer-wise training (LW-FedSSL's claim): per row of a table and
stage, the bytes it downloads and uploads, one local step's FLOPs and peak memory
(`layerwise_costs`; `bin/benchmark --layerwise`), their totals over a run (`layerwise_totals`), and
the cost appendix of the LW-FedSSL table (`layerwise_cost_report`)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tff_ssl import cost, rundir
from tff_ssl import data as data_lib
from tff_ssl import runner as runner_lib
from tff_ssl.benchmarks.common import ratio
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import ssl_model
from tff_ssl.federated.functional import FunctionalModel
from tff_ssl.methods import layerwise


def layerwise_costs(rows, image_shape=None, *, batch: int = 0, seed: int = 0,
                    memory: bool = False, flops: bool = True) -> list[dict]:
  """Per row (name, `ExperimentConfig`; the first is the end-to-end reference) and stage s of its
  ViT's blocks, what one client pays in a round: its download (the stage model the simulation
  broadcasts, and what a client that took part in every round needs: the trained tensors, or the
  whole stage model where the server changes the frozen blocks) and upload (bytes, from the TFF
  types), one local step's float operations (from the graph; FLL + DD: the expectation over its keep
  draws, from the graphs of every frozen block kept and of none) and, with `memory`, the step's
  measured peak memory (`cost.peak_memory`, every block kept). A step takes `batch` images (0: the
  row's local batch). End-to-end rows train the whole model in every stage."""
  out = []
  depth = None
  for name, config in rows:
    shape = tuple(image_shape or data_lib.image_shape(config.dataset))
    b = batch or config.local_batch_size
    if b < 2:
      raise ValueError(f"{name}: a local step needs a batch of >= 2 images; got {b} (set --batch)")
    images = np.random.default_rng(seed).integers(0, 256, (b,) + shape, np.uint8)
    tf.keras.utils.set_random_seed(config.seed)
    model = FunctionalModel(ssl_model.ssl_model_builder(config, shape))
    process = runner_lib.build_process(config, model, shape)
    stages = max(layerwise.block_of(n) for n in model.names)
    if depth is not None and stages != depth:
      raise ValueError(f"{name}: its encoder has {stages} blocks, the reference's {depth}")
    depth = stages
    for s in range(1, depth + 1):
      # A layer-wise process's stage model, or the whole model in every stage (end to end).
      stage_model, mask, cfg, refresh = process.local_step_parts(s)
      c = cost.local_step_cost(stage_model, mask, cfg, images, memory=memory, flops=flops)
      skipped = [t.skipped_blocks() for t in cfg.terms if t.skipped_blocks() is not None]
      if flops and skipped:  # Each block skipped with probability p: the expected FLOPs.
        keep, p = skipped[0]
        none = cost.local_step_cost(stage_model, mask, cfg, images, flops=True,
                                    keep=keep)["step_flops"]
        c["step_flops"] = int(round(none + (1 - p) * (c["step_flops"] - none)))
      c["kept_download_bytes"] = c["download_bytes"] if refresh else c["trained_bytes"]
      # The paper's communication figures count the encoder only (the heads are common to all).
      encoder = [n.startswith(ssl_model.ENCODER_NAME + "/") for n in stage_model.names]
      sizes = [int(np.prod(w.shape)) * w.dtype.size for w in stage_model.weight_specs]
      c["encoder_download_bytes"] = sum(b for b, e, t in zip(sizes, encoder, mask.trained)
                                        if e and (refresh or t))
      c["encoder_upload_bytes"] = sum(b for b, e, t in zip(sizes, encoder, mask.trained) if e and t)
      out.append({"method": name, "stage": s, "batch": b, **c})
  reference = {r["stage"]: r for r in out if r["method"] == rows[0][0]}
  for r in out:
    ref = reference[r["stage"]]
    for key in ("download_bytes", "kept_download_bytes", "upload_bytes", "step_flops",
                "step_peak_bytes"):
      if key in r:
        r[key.replace("_bytes", "").replace("step_", "") + "_ratio"] = ratio(r[key], ref[key])
  return out


def table_rows(table) -> list[tuple[str, ExperimentConfig]]:
  """(name, config) of each row of a `tff_ssl.tables.Table` in its first column."""
  return [(row.name, table.cell_config(row, table.columns[0])) for row in table.rows]


def write_rows(rows, path: str) -> None:
  """(name, config) rows as JSON (`read_rows` reads them)."""
  rundir.write_atomic(path, json.dumps([{"name": n, "config": dataclasses.asdict(c)}
                                        for n, c in rows], indent=1) + "\n")


def read_rows(path: str) -> list[tuple[str, ExperimentConfig]]:
  with open(path) as f:
    return [(r["name"], ExperimentConfig(**r["config"])) for r in json.load(f)]


def layerwise_cost_report(table, output_dir: str, *, memory: bool, flops: bool) -> str:
  """The markdown of `bin/benchmark --layerwise` for a table's rows, run in a process of its own
  (the memory measurement needs `cost.MEASURING_ENV` from the start): the rows go to
  output_dir/cost_rows.json, the costs to output_dir/cost.csv and the markdown to
  output_dir/cost.md, which a later call with the same rows reads instead of measuring again."""
  rows_path, path = os.path.join(output_dir, "cost_rows.json"), os.path.join(output_dir, "cost.md")
  rows = table_rows(table)
  if os.path.exists(path) and os.path.exists(rows_path) and read_rows(rows_path) == rows:
    return open(path).read()
  write_rows(rows, rows_path)
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  binary = os.path.join(root, "bin", "benchmark")
  command = [sys.executable, binary, "--layerwise", f"--layerwise_rows={rows_path}",
             f"--output_csv={os.path.join(output_dir, 'cost.csv')}",
             "--memory" if memory else "--nomemory", "--flops" if flops else "--noflops"]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip().splitlines()[-1:]}")
  text = done.stdout.split(COST_TABLE_START, 1)[-1].split("\nwrote ", 1)[0]
  md = f"## What a client pays\n\n{COST_TABLE_START}{text.rstrip()}\n"
  rundir.write_atomic(path, md)
  return md


def layerwise_totals(rows: list[dict]) -> list[dict]:
  """Per method, over a run of equal stages: total download (of a client in every round), upload
  and local FLOPs, and the peak memory of the worst stage, each beside the first method's
  (end-to-end) as the paper's "x lower" ratios."""
  names, out = list(dict.fromkeys(r["method"] for r in rows)), []
  for m in names:
    mine = [r for r in rows if r["method"] == m]
    t = {"method": m, "download_bytes": sum(r["kept_download_bytes"] for r in mine),
         "upload_bytes": sum(r["upload_bytes"] for r in mine),
         "encoder_download_bytes": sum(r["encoder_download_bytes"] for r in mine),
         "encoder_upload_bytes": sum(r["encoder_upload_bytes"] for r in mine)}
    t["encoder_total_bytes"] = t["encoder_download_bytes"] + t["encoder_upload_bytes"]
    if "step_flops" in mine[0]:
      t["flops"] = sum(r["step_flops"] for r in mine)
    if "step_peak_bytes" in mine[0]:
      t["peak_bytes"] = max(r["step_peak_bytes"] for r in mine)
    out.append(t)
  for t in out:
    for key in [k for k in t if k != "method"]:
      t[key + "_lower"] = ratio(out[0][key], t[key])
  return out


COST_TABLE_START = "A client's cost per round of stage s"


def format_layerwise_table(rows: list[dict]) -> str:
  memory, flops = "step_peak_bytes" in rows[0], "step_flops" in rows[0]
  batches = ", ".join(f"{m}: {b}" for m, b in dict((r["method"], r["batch"]) for r in rows).items())
  lines = [f"{COST_TABLE_START}: download (MB, from the TFF types: the stage model the simulation "
           f"broadcasts, and what a client in every round needs), upload (MB)"
           + (f", one local step (GFLOPs, from the graph; elementwise ops TF does not count: "
              f"{', '.join(rows[0]['uncounted_ops']) or 'none'})" if flops else "")
           + (", its measured peak memory above the model's weights (MB)" if memory else "")
           + f". Images per local step: {batches}.", "",
           "| method | stage | broadcast MB | needed MB | upload MB | ÷ end-to-end |"
           + (" step GFLOPs | ÷ end-to-end |" if flops else "")
           + (" step peak MB | ÷ end-to-end |" if memory else ""),
           "|---|---|---|---|---|---|" + ("---|---|" if flops else "") + ("---|---|" if memory else "")]
  for r in rows:
    lines.append(f"| {r['method']} | {r['stage']} | {r['download_bytes'] / 2**20:.2f} | "
                 f"{r['kept_download_bytes'] / 2**20:.2f} | "
                 f"{r['upload_bytes'] / 2**20:.2f} | {r['upload_ratio']:.2f} |" +
                 (f" {r['step_flops'] / 1e9:.3f} | {r['flops_ratio']:.2f} |" if flops else "") +
                 (f" {r['step_peak_bytes'] / 2**20:.1f} | {r['peak_ratio']:.2f} |" if memory else ""))
  totals = layerwise_totals(rows)
  lines += ["", "Over a run of equal stages, the first row's (end-to-end) total, or peak, ÷ the "
            "method's: how many times lower (the paper's headline form).", "",
            "| method | download × lower | upload × lower | encoder only (the paper's "
            "accounting): download / upload / both × lower |" + (" FLOPs × lower |" if flops else "")
            + (" peak memory × lower |" if memory else ""),
            "|---|---|---|---|" + ("---|" if flops else "") + ("---|" if memory else "")]
  for t in totals:
    lines.append(f"| {t['method']} | {t['download_bytes_lower']:.2f} | "
                 f"{t['upload_bytes_lower']:.2f} | {t['encoder_download_bytes_lower']:.2f} / "
                 f"{t['encoder_upload_bytes_lower']:.2f} / {t['encoder_total_bytes_lower']:.2f} |" +
                 (f" {t['flops_lower']:.2f} |" if flops else "") +
                 (f" {t['peak_bytes_lower']:.2f} |" if memory else ""))
  return "\n".join(lines)
