"""MoCo v3's learning-rate schedule (linear warm-up, then cosine decay) over a run: its closed form
centralized (Keras) and at the clients (a function of the round and the local step), the rate each
client's SGD step takes in its round, and a layer-wise run's rates across stages unchanged by a
kill -9 + resume."""

import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.bin import binaries
from tff_ssl import optim, runner
from tff_ssl.data import synthetic
from tff_ssl.experiment import ExperimentConfig
from tff_ssl.federated import client_work, common
from tff_ssl.federated import local_steps
from tff_ssl.federated.functional import FunctionalModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def closed_form(peak, progress, warmup):
  """The schedule written out: progress / warmup during the warm-up, then half a cosine to 0."""
  if progress < warmup:
    return peak * progress / warmup
  return peak * 0.5 * (1 + math.cos(math.pi * (progress - warmup) / (1 - warmup)))


def test_the_clients_schedule_is_the_closed_form_of_round_and_step():
  s = local_steps.ClientSchedule(1e-3, "warmup_cosine", rounds=12, warmup_fraction=0.25)
  # (round, step, steps this round) -> the progress (round + step / steps) / rounds.
  for r, step, steps, progress in ((0, 0, 1, 0.0), (1, 1, 2, 1.5 / 12), (3, 0, 9, 0.25),
                                   (7, 2, 4, 7.5 / 12), (11, 8, 9, (11 + 8 / 9) / 12)):
    assert s.rate(r, step, steps) == pytest.approx(closed_form(1e-3, progress, 0.25), rel=1e-6)
  assert s.rate(0, 0, 1) == 0 and s.rate(3, 0, 1) == pytest.approx(1e-3)
  assert s.rate(7, 2, 4) == pytest.approx(5e-4)  # Half-way through the decay.
  # The same in TensorFlow (inside a client's computation).
  assert float(s.rate(tf.constant(7.0), tf.constant(2.0), tf.constant(4.0))) == pytest.approx(5e-4)
  assert local_steps.ClientSchedule(0.1).rate(5, 3, 4) == 0.1  # Constant.
  with pytest.raises(ValueError, match=r"warmup_fraction \(0.1\) needs "
                                       r"--client_lr_schedule=warmup_cosine"):
    local_steps.ClientSchedule(0.1, warmup_fraction=0.1)


def test_centralized_keras_schedule_is_the_same_closed_form_over_steps():
  schedule = optim.warmup_cosine_schedule(2e-3, 100, 0.1)
  for step in (0, 5, 10, 40, 99, 100):
    assert float(schedule(step)) == pytest.approx(closed_form(2e-3, step / 100, 0.1), abs=1e-9)
  # No warm-up: the plain cosine decay every centralized run had before (the same object).
  assert isinstance(optim.warmup_cosine_schedule(2e-3, 100, 0.0),
                    tf.keras.optimizers.schedules.CosineDecay)
  assert float(optim.warmup_cosine_schedule(2e-3, 100, 0.0)(50)) == pytest.approx(1e-3)


def tiny():
  cfg = ExperimentConfig(method="fedavg", ssl="simclr", encoder="vit_mini", patch_size=7, depth=1,
                         width=0.25, projector=(8,), dataset="synthetic", seed=0)
  train = synthetic("train", num_examples=8, seed=0)
  tf.keras.utils.set_random_seed(0)
  model = FunctionalModel(runner.ssl_model_builder(cfg, train.image_shape))
  return model, common.client_inputs(train.images[:4], np.arange(4))


@pytest.mark.parametrize("batch", [0, 4])  # Full batch (one step an epoch), mini-batches of 4.
def test_each_clients_sgd_step_takes_the_rate_of_its_round(batch):
  """One SGD step from the same weights on the same views (the seed's run part fixed, the round
  varied through the schedule only): the update is the closed-form rate times the gradient, which
  the constant rate 1 gives."""
  model, client = tiny()
  weights = [tf.constant(w) for w in model.initial_weights]
  base = client_work.ClientConfig(ssl="simclr", client_optimizer="sgd", client_learning_rate=1.0,
                                  local_steps=1, local_batch_size=batch, seed=0)
  seed = common.round_seed(0, 0)
  gradient = client_work.local_training(model, base, weights, seed, client)[0]
  scheduled = client_work.ClientConfig(
      ssl="simclr", client_optimizer="sgd", client_learning_rate=0.5, local_steps=1,
      local_batch_size=batch, seed=0, lr_schedule="warmup_cosine", warmup_fraction=0.25, rounds=8)
  for r in (1, 2, 5):  # Warm-up, peak, decay.
    # The round comes from the round's seed; the views from the same seed as the reference's.
    delta = client_work.local_training(model, scheduled, weights, seed, client, round_num=r)[0]
    rate = closed_form(0.5, r / 8, 0.25)
    for d, g in zip(delta, gradient):
      np.testing.assert_allclose(np.asarray(d), rate * np.asarray(g), rtol=1e-4, atol=1e-7)
  # Without round_num the round is the seed's (round 5's seed: its own views, a decayed rate).
  assert float(common.round_of(common.round_seed(0, 5))) == 5.0


def test_a_layerwise_run_follows_the_schedule_across_stages_and_a_kill_9_resume(tmp_path):
  """LW-FedSSL (its calibration trains with the clients' schedule) over 2 blocks, 6 rounds (3 a
  stage), warm-up over a third of the run: each round's recorded client rate is the closed form at
  round / 6, through both stages; killed after its round-3 checkpoint (the first round of stage 2
  next) and rerun, it gives the same losses, calibration losses and rates, bit for bit, as the
  uninterrupted run."""
  args = ["--task=synthetic_dcco_smoke", "--method=lw_fedssl", "--auxiliary_fraction=0.005", "--ssl=mocov3", "--encoder=vit_mini",
          "--patch_size=7", "--depth=2", "--width=0.25", "--projector=16,8", "--predictor=16,8",
          "--temperature=0.2", "--server_optimizer=sgd", "--server_learning_rate=1.0",
          "--server_lr_schedule=constant", "--client_optimizer=adamw",
          "--client_learning_rate=1e-3", "--client_weight_decay=0.1",
          "--client_lr_schedule=warmup_cosine", "--warmup_fraction=0.34", "--rounds=6",
          "--num_clients=4", "--samples_per_client=4", "--clients_per_round=2",
          "--local_batch_size=2", "--freeze_patch_embed", "--checkpoint_every=1",
          "--eval_steps=5"]
  train = os.path.join(ROOT, "bin", "train")
  full, killed = tmp_path / "full", tmp_path / "killed"
  # The uninterrupted run and the rerun in this process (bin/train's main(); the rerun reuses the
  # built process), the killed one in a process of its own.
  proc = binaries.train_in_process(f"--output_dir={full}", *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [r.split(",") for r in (full / "aggregation.csv").read_text().splitlines()]
  column = rows[0].index("client_learning_rate")
  rates = [float(r[column]) for r in rows[1:]]
  assert rates == pytest.approx([closed_form(1e-3, r / 6, 0.34) for r in range(6)], rel=1e-6)
  assert rates[0] == 0 and max(rates) == rates[2]  # Stage 1's rounds warm up; stage 2's decay.
  assert "calibration_loss" in rows[0]

  child = subprocess.Popen([sys.executable, train, f"--output_dir={killed}", *args],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 600
  while not (killed / "checkpoints" / "program_state_3").exists():
    assert child.poll() is None and time.time() < deadline, "the run ended before its checkpoint"
    time.sleep(0.2)
  child.send_signal(signal.SIGKILL)
  child.wait()
  proc = binaries.train_in_process(f"--output_dir={killed}", *args)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("metrics.csv", "aggregation.csv"):
    assert (killed / name).read_text() == (full / name).read_text(), name
