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
