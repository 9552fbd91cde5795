"""The centralized ViT gate as data: MoCo v3's ViT recipe on every row, each row one lever on top of
the row before, and each row whose encoder is not the first row's gated against its own random
initialization (`reproduce.cell_baselines`), computed once per architecture."""

import json
import os

import pytest

import tasks
from tasks import centralized_gate_vit
from tff_ssl import reproduce, table_report
from tff_ssl.data import synthetic
from tff_ssl.tables import TUNED_GATE


def test_rows_are_the_recipe_and_the_levers_in_turn():
  table = tasks.get_table("centralized_gate_vit", "mini")
  assert [r.key for r in table.rows] == ["cls", "mean", "mean_frozen", "mean_w192", "mean_d8",
                                         "mean_p4"]
  configs = {r.key: table.cell_config(r, None) for r in table.rows}
  for c in configs.values():
    assert (c.method, c.ssl, c.encoder, c.optimizer, c.weight_decay, c.warmup_fraction) == (
        "centralized", "mocov3", "vit_mini", "adamw", 0.1, 0.1)
    assert (c.freeze_patch_embed, c.head_norm, c.crop_min_scale, c.batch_size, c.steps) == (
        c.readout == "mean" and c is configs["mean_frozen"], "batch", 0.5, 128, 3000)
  differs = {k: {f for f in reproduce.ENCODER_FIELDS if getattr(c, f) != getattr(configs["cls"], f)}
             for k, c in configs.items()}
  assert differs == {"cls": set(), "mean": {"readout"}, "mean_frozen": {"readout"},
                     "mean_w192": {"readout", "width"},
                     "mean_d8": {"readout", "depth"}, "mean_p4": {"readout", "patch_size"}}
  assert table.gate_keys == TUNED_GATE


def test_other_encoders_get_their_own_random_init_once_per_architecture(tmp_path, monkeypatch):
  table = centralized_gate_vit.mini()
  todo, _ = reproduce.cells(table)
  calls = []

  def fake_evaluate(encoder, train, test, protocol):
    calls.append(encoder.count_params())
    return encoder.count_params() / 1e6 + protocol.seed / 100

  monkeypatch.setattr(reproduce.evaluation, "evaluate", fake_evaluate)
  monkeypatch.setattr(reproduce.experiment, "load_splits",
                      lambda config: (synthetic("train", num_examples=8), synthetic("test", num_examples=8)))
  out = str(tmp_path)
  own = reproduce.cell_baselines(table, out, todo)
  assert set(own) == {(r.key, "") for r in table.rows}
  assert own[("mean", "")] == own[("mean_frozen", "")]  # Freezing does not change the initialization.
  frozen = [e for e in table.evaluations]  # Every evaluation is a frozen-feature one.
  # Raw pixels once per evaluation; random init once per architecture (five) and evaluation.
  assert len(calls) == len(frozen) * (1 + 5) and calls.count(0) == len(frozen)
  wide = own[("mean_w192", "")]
  assert wide["tuned_10_s1"]["random_init"] - wide["tuned_10_s0"]["random_init"] == pytest.approx(
      0.01)
  assert wide["tuned_10_s0"]["random_init"] > own[("mean", "")]["tuned_10_s0"]["random_init"]
  assert wide["tuned_10_s0"]["raw_pixels"] == own[("cls", "")]["tuned_10_s0"]["raw_pixels"]
  stored = json.load(open(os.path.join(out, "random_init.json")))
  assert len(stored["random_init"]) == 5 * len(frozen) and len(stored["raw_pixels"]) == len(frozen)
  # A second call reads them back.
  assert reproduce.cell_baselines(table, out, todo) == own and len(calls) == 6 * len(frozen)
  # The gate reads a cell's own baseline: 0.9 is 20 points above the table's random init (0.7) but
  # not 10 above its own (0.85).
  records = [{"evaluation": k, "row": r, "column": "", "ours": 0.9}
             for r in ("cls", "mean") for k in TUNED_GATE]
  own = {("mean", ""): {k: {"random_init": 0.85} for k in TUNED_GATE}}
  g = table_report.gate(table, records, {k: {"raw_pixels": 0.8, "random_init": 0.7}
                                         for k in TUNED_GATE}, own)
  assert g.passes("cls", "") and not g.passes("mean", "")
