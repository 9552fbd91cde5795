"""--ema_eval=beta: the probes read an exponential moving average of the server's weights.

  * The encoder a finished run's checkpoint gives (what bin/evaluate and --init_from read) is the
    average of the weights after each round, computed here by hand from the same run's trajectory
    (`runner.trajectory`) with decay min(beta, (1 + t) / (10 + t)).
  * A run killed after a checkpoint resumes to the same average and the same final probe.
  * Refused in one line for a method that is not federated.
"""

import dataclasses
import json
import os
import shutil

import numpy as np

import tasks
from tff_ssl import cli, experiment, runner
from tff_ssl.federated import functional
from tests.bin.binaries import train_in_process

FLAGS = ("--task=synthetic_dcco_smoke", "--rounds=3", "--checkpoint_every=1", "--ema_eval=0.5",
         "--eval_steps=5")


def test_the_probe_reads_the_average_of_the_rounds_weights_and_resumes_it(tmp_path):
  out = str(tmp_path / "run")
  ended = train_in_process(*FLAGS, f"--output_dir={out}")
  assert ended.returncode == 0, ended.stderr[-2000:]
  config = dataclasses.replace(tasks.get_task("synthetic_dcco_smoke"), rounds=3, checkpoint_every=1,
                               ema_eval=0.5, eval_steps=5)
  train, _ = experiment.load_splits(config)
  average = None
  for r, model, weights, _ in runner.trajectory(config, train, 3):
    average = average or [w.astype(np.float64) for w in model.initial_weights]
    decay = min(0.5, (1 + r) / (10 + r))
    average = [decay * a + (1 - decay) * w for a, w in zip(average, weights)]
    last = weights
  by_name = dict(zip(model.names, average))
  _, encoder = experiment.load_encoder(out)
  read = {"encoder/" + p: v.numpy() for p, v in functional.weight_paths(encoder).items()}
  assert read and all(np.allclose(v, by_name[n], rtol=1e-5, atol=1e-6) for n, v in read.items())
  # Not the last weights: the average is what the probe read.
  assert not all(np.allclose(v, dict(zip(model.names, last))[n]) for n, v in read.items())
  with open(os.path.join(out, "results.json")) as f:
    first = json.load(f)

  # Killed after round 2's checkpoint: the rerun resumes the average and ends where the first did.
  shutil.rmtree(os.path.join(out, "checkpoints", "program_state_3"))
  os.remove(os.path.join(out, "results.json"))
  ended = train_in_process(*FLAGS, f"--output_dir={out}")
  assert ended.returncode == 0, ended.stderr[-2000:]
  with open(os.path.join(out, "results.json")) as f:
    again = json.load(f)
  assert again["linear_probe_accuracy_pretrained"] == first["linear_probe_accuracy_pretrained"]
  _, encoder = experiment.load_encoder(out)
  for p, v in functional.weight_paths(encoder).items():
    np.testing.assert_allclose(v.numpy(), read["encoder/" + p], rtol=1e-6, atol=1e-7)


def test_ema_eval_is_refused_where_there_is_no_server_model(tmp_path):
  out = tmp_path / "run"
  ended = train_in_process("--task=synthetic_smoke", "--ema_eval=0.9", f"--output_dir={out}")
  assert ended.returncode == cli.EXIT_ERROR and "averages a federated run" in ended.stderr
  assert ended.stderr.strip().count("\n") == 0 and not out.exists()
