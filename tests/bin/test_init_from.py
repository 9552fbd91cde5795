"""--init_from: a federated run starts from another finished run's encoder (e.g. one pretrained on
synthetic images), every part of its process from those weights.

  * The probe of the encoder it starts from (linear_probe_accuracy_init_from) equals the source
    run's own final probe, to the last digit: same weights, same probe, same data.
  * Refused in one line, exit 2, nothing written: encoders of other shapes, a folder that holds no
    run, a method that is not federated.
"""

import json
import os

from tff_ssl import cli
from tests.bin.binaries import train_in_process


def test_a_federated_run_starts_from_a_finished_runs_encoder(tmp_path):
  source, run = str(tmp_path / "source"), str(tmp_path / "run")
  ended = train_in_process("--task=synthetic_smoke", f"--output_dir={source}")
  assert ended.returncode == 0, ended.stderr[-2000:]
  ended = train_in_process("--task=synthetic_dcco_smoke", "--rounds=1", f"--init_from={source}",
                           f"--output_dir={run}")
  assert ended.returncode == 0, ended.stderr[-2000:]
  assert "initialization (--init_from):" in ended.stdout
  with open(os.path.join(source, "results.json")) as f:
    before = json.load(f)
  with open(os.path.join(run, "results.json")) as f:
    after = json.load(f)
  assert after["linear_probe_accuracy_init_from"] == before["linear_probe_accuracy_pretrained"]
  assert "linear_probe_accuracy_random_init" not in after and after["init_from"] == source

  for flags, reason in ((["--task=synthetic_dcco_smoke", "--width=1.0"], "has shape"),
                        (["--task=synthetic_dcco_smoke", f"--init_from={tmp_path / 'none'}"],
                         "is not a run folder"),
                        (["--task=synthetic_smoke"], "starts a federated run")):
    out = tmp_path / "refused"
    if not any(f.startswith("--init_from") for f in flags):
      flags = flags + [f"--init_from={source}"]
    ended = train_in_process(*flags, f"--output_dir={out}")
    assert ended.returncode == cli.EXIT_ERROR, ended.stderr[-2000:]
    assert reason in ended.stderr and ended.stderr.strip().count("\n") == 0
    assert "--init_from" in ended.stderr and not out.exists()


def test_a_centralized_run_probes_the_images_it_is_meant_for(tmp_path, monkeypatch):
  """--probe_dataset: a centralized run pretrains on one source and every probe of it (the run's
  own, its raw-pixel and random-init baselines, bin/evaluate's default) reads another: each equals
  the same probe computed here on that source's splits, to the last digit. Refused in one line
  (exit 2, nothing written): a federated method, a source of other image shape."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from tff_ssl import evaluation, experiment  # pylint: disable=g-import-not-at-top
  from tff_ssl.data import sources  # pylint: disable=g-import-not-at-top
  # A small stand-in for the dead leaves (other images and 4 classes), so that the test is quick.
  monkeypatch.setitem(sources.SOURCES, "synthetic_leaves", lambda split, data_dir=None,
                      download=False: sources.synthetic(split, num_classes=4, seed=7))
  source = str(tmp_path / "source")
  ended = train_in_process("--task=synthetic_smoke", "--probe_dataset=synthetic_leaves",
                           f"--output_dir={source}")
  assert ended.returncode == 0, ended.stderr[-2000:]
  with open(os.path.join(source, "results.json")) as f:
    results = json.load(f)
  assert results["dataset"] == "synthetic" and results["probe_dataset"] == "synthetic_leaves"
  config, encoder = experiment.load_encoder(source)
  probe_config = dataclasses.replace(config, dataset="synthetic_leaves", probe_dataset="")
  train, test = experiment.load_splits(probe_config)
  assert train.num_classes == 4
  probe = config.probe_config()
  assert results["linear_probe_accuracy_pretrained"] == evaluation.linear_probe(
      encoder, train, test, probe)
  assert results["linear_probe_accuracy_raw_pixels"] == evaluation.linear_probe(
      evaluation.raw_pixels(train.image_shape), train, test, probe)
  own = experiment.load_splits(config)  # The pretraining source's labels give another number.
  assert results["linear_probe_accuracy_pretrained"] != evaluation.linear_probe(
      encoder, *own, probe)
  path, record = experiment.evaluate_run(source)
  assert record["dataset"] == "synthetic_leaves" and path.endswith("_synthetic_leaves.json")

  for flags, reason in ((["--task=synthetic_dcco_smoke"], "method 'dcco' is federated"),
                        (["--task=synthetic_smoke", "--probe_dataset=cifar10"], "of that shape")):
    out = tmp_path / "refused"
    ended = train_in_process(*flags, "--probe_dataset=synthetic_leaves" if len(flags) == 1 else
                             "--seed=0", f"--output_dir={out}")
    assert ended.returncode == cli.EXIT_ERROR, ended.stderr[-2000:]
    assert reason in ended.stderr and ended.stderr.strip().count("\n") == 0, ended.stderr
    assert "--probe_dataset" in ended.stderr and not out.exists()
