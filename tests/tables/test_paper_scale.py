"""The paper-scale DCCO Table 1: every row's settings checked from the table, 2 rounds of DCCO and the
supervised row on mock CIFAR-100 with the model shrunk, and DCCO built at paper size
(tests/tables/paper_smoke.py). The FedAvg process runs in test_ldawa_table.py; centralized
pretraining is the same code at every scale."""

import csv
import dataclasses
import json
import os

from tasks import dcco_table1
from tff_ssl import reproduce
from tests.tables import paper_smoke
from tests.tables.mock_data import mock_cifar


def mock_cifar100(num_train=50_000, num_test=100):
  return mock_cifar(100, num_train, num_test, size=paper_smoke.SMOKE_IMAGE_SIZE)


def check_hparams(hp, row, steps=2):
  assert hp["dataset"] == "cifar100" and hp["encoder"] == "resnet14" and hp["stem_stride"] == 1
  if row.supervised:
    assert (hp["optimizer"], hp["learning_rate"], hp["batch_size"]) == ("adam", 0.01, 256)
    return
  contrastive = row.key in ("fedavg_simclr", "centralized_simclr")
  assert tuple(hp["projector"]) == ((256, 256, 128) if contrastive else (1024,) * 3)
  if row.federated:
    # The paper's round: 3,125 clients of 16, 32 per round (global batch 512), client GD at 1.0,
    # server Adam at the first candidate.
    assert (hp["num_clients"], hp["samples_per_client"], hp["clients_per_round"]) == (3125, 16, 32)
    assert (hp["client_optimizer"], hp["client_learning_rate"], hp["local_steps"]) == ("sgd", 1, 1)
    assert (hp["server_optimizer"], hp["server_learning_rate"]) == ("adam", 5e-3)
  else:
    assert (hp["batch_size"], hp["optimizer"], hp["learning_rate"], hp["steps"]) == (
        512, "adam", 5e-3, steps)


def test_paper_settings_of_every_row_and_two_rounds_of_dcco_and_supervised(tmp_path):
  table = dcco_table1.paper()
  # One column (32 clients of 16 images per round), at the first candidate learning rate:
  # selection, resume and failures are the same code at every scale (tests/tables/test_reproduce.py).
  table = dataclasses.replace(
      table, rows=tuple(dataclasses.replace(r, learning_rates=r.learning_rates[:1])
                        for r in table.rows),
      columns=(table.column("noniid_16"),))
  column = table.column("noniid_16")
  for row in table.rows:
    config = (table.supervised_config(row, 0.1, 50_000) if row.supervised else
              table.cell_config(row, column if row.federated else None))
    check_hparams(dataclasses.asdict(config), row, steps=97_000)
  # DCCO and the supervised row run 2 rounds (steps) on 1,024 mock 8 px images, the model shrunk
  # (tests/tables/paper_smoke.py); the paper-size model: test_paper_size_model_and_types.
  table = paper_smoke.smoke(table.select(["dcco", "supervised"]))
  table = dataclasses.replace(table, columns=(dataclasses.replace(column, num_clients=64),))
  out = str(tmp_path / "paper")
  with mock_cifar100(num_train=1024, num_test=100):
    result = reproduce.reproduce(table, out, progress=False)
  todo, _ = reproduce.cells(table)
  assert [c.path for c in todo] == [
      "cells/dcco/noniid_16", "cells/supervised/labels_0.1", "cells/supervised/labels_0.01"]
  for cell in todo:
    hp = json.load(open(os.path.join(out, cell.path, "hparams.json")))
    assert hp["dataset"] == "cifar100" and hp["encoder"] == paper_smoke.SHALLOW["resnet14"]
    if cell.row.federated:  # 2 rounds were run.
      assert (hp["samples_per_client"], hp["clients_per_round"], hp["rounds"]) == (16, 32, 2)
      with open(os.path.join(out, cell.path, "metrics.csv")) as f:
        assert [line.split(",")[0] for line in f.read().split()[1:]] == ["0", "1"]
  assert not os.path.exists(os.path.join(out, "selection"))  # One candidate: no pilots.
  rows = list(csv.DictReader(open(result["table_csv"])))
  ours = [r for r in rows if r["status"] == "ok"]
  # Three evaluations (linear 10%, fine-tuning 10%, linear 1%) of the two rows.
  assert len(ours) == 3 * 2 and all(0 <= float(r["ours"]) <= 100 for r in ours)
  assert {r["evaluation"] for r in ours} == {"linear_10", "finetune_10", "linear_1"}
  md = open(result["table_md"]).read()
  assert "smoke" in md and "| DCCO | **" in md and "(45.9)" in md
  assert open(result["curves_png"], "rb").read(4) == b"\x89PNG"


def test_paper_size_model_and_types():
  """DCCO's row at paper size, built and not trained: ResNet-14 (16/32/64 filters, 1 x 1 projection
  shortcuts) with CCO's 1024 x 3 projector on 32 px CIFAR-100, and its round's TFF types."""
  table = dcco_table1.paper()
  config = table.cell_config(table.row("dcco"), table.column("noniid_16"))
  _, params, process = paper_smoke.paper_model(config, (32, 32, 3))
  conv = lambda k, i, o: k * k * i * o + 2 * o  # noqa: E731  # GroupNorm: 2 weights a channel.
  resnet14 = (conv(3, 3, 16) + 4 * conv(3, 16, 16)
              + conv(3, 16, 32) + 3 * conv(3, 32, 32) + conv(1, 16, 32)
              + conv(3, 32, 64) + 3 * conv(3, 64, 64) + conv(1, 32, 64))
  assert params == resnet14 + paper_smoke.head_params(64, (1024, 1024, 1024))
  stats = process.aggregate_statistics.type_signature
  assert str(stats.parameter.weights) == f"float32[{params}]@SERVER"
  assert "images=uint8[?,32,32,3]" in str(stats.parameter.data)
  assert stats.result.member.statistics.mean_fg.shape == (1024, 1024)
  assert str(process.aggregate_updates.type_signature.result.update) == f"float32[{params}]@SERVER"
