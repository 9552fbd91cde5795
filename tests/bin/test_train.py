"""bin/train: a smoke run, its run folder, and one-line errors for bad input."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from absl import flags

from tff_ssl import cli, config_fields, experiment

from tests.bin import binaries

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "bin", "train")


train = binaries.load_train()


def other_value(spec):
  """A value of `spec`'s type other than its default, and how it is written on the command line."""
  choices = spec.choice_list()
  if spec.type is bool:
    return (not spec.default), str(not spec.default).lower()
  if spec.type is tuple:  # Choices, where a tuple has them, are its items'.
    value = tuple(choices[:2]) if choices else (3, 5) if spec.item is int else ("a", "b")
    if value == spec.default:
      value = value[::-1]
    return value, ",".join(str(v) for v in value)
  if choices:
    value = next(c for c in choices if c != spec.default)
    return value, str(value)
  if spec.type is int:
    return (spec.default or 0) + 7, str((spec.default or 0) + 7)
  if spec.type is float:
    return (spec.default or 0.0) + 0.25, repr((spec.default or 0.0) + 0.25)
  return "other", "other"


def test_every_config_field_set_as_a_flag_reaches_the_config_in_its_type():
  specs = config_fields.specs(experiment.ExperimentConfig)
  assert {s.name for s in specs} == {f.name for f in dataclasses.fields(experiment.ExperimentConfig)}
  flag_values = flags.FlagValues()
  cli.define_config_flags(experiment.ExperimentConfig, flag_values)
  wanted = {s.name: other_value(s) for s in specs}
  flag_values(["train"] + [f"--{name}={text}" for name, (_, text) in wanted.items()])
  overrides = cli.config_overrides(experiment.ExperimentConfig, flag_values)
  for name, (value, _) in wanted.items():
    assert overrides[name] == value and type(overrides[name]) is type(value), (
        name, overrides[name], value)
  flag_values.unparse_flags()
  flag_values(["train"])
  assert cli.config_overrides(experiment.ExperimentConfig, flag_values) == {}  # Unset: the task's.


def test_smoke_run_writes_a_finished_run_folder(tmp_path):
  out = str(tmp_path / "run")
  proc = binaries.train_in_process("--task=synthetic_smoke", f"--output_dir={out}", "--steps=2",
                                   "--eval_steps=5")
  assert proc.returncode == 0, proc.stderr[-3000:]
  printed = proc.stdout
  assert "pretrained (centralized, cco, 2 steps)" in printed and "random initialization" in printed
  results = json.load(open(os.path.join(out, "results.json")))
  hparams = json.load(open(os.path.join(out, "hparams.json")))
  assert hparams["steps"] == 2 and hparams["dataset"] == "synthetic"
  assert 0 <= results["linear_probe_accuracy_pretrained"] <= 1
  assert 0 <= results["linear_probe_accuracy_random_init"] <= 1
  assert 0 <= results["linear_probe_accuracy_raw_pixels"] <= 1
  assert "raw pixels (no encoder)" in printed
  # Through the release managers of a federated run (tff_ssl/observers.py, StepSinks): no probe ran
  # in 2 steps, so no probe column.
  rows = open(os.path.join(out, "metrics.csv")).read().splitlines()
  assert rows[0] == "step,loss" and [r.split(",")[0] for r in rows[1:]] == ["0", "1"]
  assert os.listdir(os.path.join(out, "tensorboard"))


# A flag absl rejects and a value the experiment rejects go through the binary; the rest run
# bin/train's main() in this process (a new TensorFlow process costs ~6 s a case).
THROUGH_THE_BINARY = {"--method=byol", "--task=synthetic_smoke --batch_size=5000"}


@pytest.mark.parametrize("args,message", [
    (["--method=byol"], "flag --method=byol: value should be one of"),
    (["--steps=0"], "steps must be >= 1; got 0"),
    (["--task=synthetic_smoke", "--temperature=0.5"],
     "--temperature is not used by method 'centralized' with --ssl=cco; remove it (it is read by "
     "['--ssl=simclr', '--ssl=moco', '--ssl=mocov3'])"),
    (["--task=synthetic_smoke", "--ssl=byol", "--predictor=16,31"],
     "predictor sizes must end at the projector's output 32; got [16, 31]"),
    (["--task=synthetic_smoke", "--dataset=cifar10", "--data_dir={tmp}/no_tfds"],
     "tfds dataset 'cifar10' is not prepared"),
    (["--task=synthetic_smoke", "--batch_size=5000"], "batch_size 5000 exceeds the 2000"),
    (["--task=synthetic_smoke", "--projector=64,x"], "--projector must be comma-separated integers"),
])
def test_bad_input_is_one_line_nonzero_exit_and_no_run_folder(tmp_path, args, message):
  out = tmp_path / "run"
  args = [a.format(tmp=tmp_path) for a in args]
  if " ".join(args) in THROUGH_THE_BINARY:  # As a user sees it: the binary's exit status and stderr.
    proc = subprocess.run([sys.executable, TRAIN, f"--output_dir={out}"] + args,
                          capture_output=True, text=True, timeout=600, check=False)
  else:  # bin/train's main() in this process: the same code from flag parsing on.
    proc = binaries.train_in_process(f"--output_dir={out}", *args)
  assert proc.returncode == 2
  assert proc.stderr.strip().count("\n") == 0, proc.stderr
  assert message in proc.stderr
  assert not out.exists()


def test_refuses_to_overwrite_a_finished_run(tmp_path):
  out = tmp_path / "run"
  out.mkdir()
  (out / "results.json").write_text("{}")
  proc = binaries.train_in_process(f"--output_dir={out}", "--task=synthetic_smoke")
  assert proc.returncode == 2 and "already holds a finished run" in proc.stderr
  assert (out / "results.json").read_text() == "{}"


def test_supervised_baseline_and_evaluate_a_centralized_run(tmp_path):
  sup = tmp_path / "sup"
  proc = binaries.train_in_process(f"--output_dir={sup}", "--task=synthetic_smoke",
                                   "--method=supervised", "--steps=3")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 0 <= json.load(open(sup / "results.json"))["supervised_accuracy"] <= 1

  run = tmp_path / "cco"  # A process of its own, as bin/evaluate, whose result must equal its own.
  proc = subprocess.run([sys.executable, TRAIN, f"--output_dir={run}", "--task=synthetic_smoke"],
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  want = json.load(open(run / "results.json"))["linear_probe_accuracy_pretrained"]
  evaluate = os.path.join(ROOT, "bin", "evaluate")
  proc = subprocess.run([sys.executable, evaluate, f"--run_dir={run}", "--label_fraction=0.1",
                         "--steps=20"], capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.load(open(run / "eval_linear_probe_0.1_seed0.json"))["accuracy"]
  assert got == want  # Same encoder, same probe settings as the run's own evaluation.
  # The tuned probe (bin/evaluate's library half, in this process) records what it chose.
  path, record = experiment.evaluate_run(str(run), "tuned_linear_probe", label_fraction=0.5)
  assert json.load(open(path)) == record and path.endswith("eval_tuned_linear_probe_0.5_seed0.json")
  assert 0 <= record["accuracy"] <= 1 and record["l2"] in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
  assert set(record["holdout_accuracy"]) == {
      "1e-05", "0.0001", "0.001", "0.01", "0.1", "1", "10"}
  with pytest.raises(ValueError, match="tuned_linear_probe chooses its own regularization and "
                                       "takes no steps; drop --steps"):
    experiment.evaluate_run(str(run), "tuned_linear_probe", steps=20)
  proc = subprocess.run([sys.executable, evaluate, f"--run_dir={tmp_path / 'none'}"],
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 2 and "is not a run folder" in proc.stderr
  # On another dataset of its shape (Debian's Fashion-MNIST): a record of its own.
  path, record = experiment.evaluate_run(str(run), label_fraction=0.1, steps=20,
                                         dataset="fashion_mnist")
  assert path.endswith("eval_linear_probe_0.1_seed0_fashion_mnist.json")
  assert record["dataset"] == "fashion_mnist" and 0.1 < record["accuracy"] <= 1
  with pytest.raises(ValueError, match=r"--dataset=cifar10 has images of shape \(32, 32, 3\)"):
    experiment.evaluate_run(str(run), dataset="cifar10")
