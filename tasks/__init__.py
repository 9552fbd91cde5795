"""Named, frozen experiment configurations: `bin/train --task=NAME` runs one, flags override fields."""

from __future__ import annotations

from tff_ssl.experiment import ExperimentConfig

TASKS: dict[str, ExperimentConfig] = {
    # The README's main command: short centralized CCO pretraining on Fashion-MNIST (Debian's files),
    # then a linear probe on 10% of the labels, next to the same encoder at random initialization.
    "fmnist_centralized_demo": ExperimentConfig(
        method="centralized_cco", dataset="fashion_mnist", encoder="resnet14", width=1.0,
        projector=(512, 512, 512), steps=300, batch_size=256, optimizer="adam",
        learning_rate=2e-3, crop_min_scale=0.2, blur=False, eval_label_fraction=0.1,
        eval_steps=500, seed=0),
    # Seconds-long run on synthetic images: smoke tests and trying flags.
    "synthetic_smoke": ExperimentConfig(
        method="centralized_cco", dataset="synthetic", encoder="resnet14", width=0.5,
        projector=(32, 32, 32), steps=3, batch_size=32, eval_steps=20, log_every=1, seed=0),
}


def get_task(name: str) -> ExperimentConfig:
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
  return TASKS[name]
