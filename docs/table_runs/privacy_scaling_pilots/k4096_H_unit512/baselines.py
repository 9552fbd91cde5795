"""Raw pixels and random init under the tuned probe on the validation split (pilots' baselines)."""
import json, sys
sys.path.insert(0, "/work/main")
import tensorflow as tf
from tasks import privacy_scaling_table as t
from tff_ssl import evaluation, experiment
import dataclasses
table = t.mini()
config = dataclasses.replace(table.rows[0].config, validation_fraction=0.1, num_clients=54000)
train, val = experiment.load_splits(config)
out = {}
for seed in (0, 1):
  probe = evaluation.TunedLinearProbeConfig(label_fraction=0.1, seed=seed)
  out[f"raw_s{seed}"] = evaluation.tuned_linear_probe_fit(evaluation.raw_pixels(train.image_shape), train, val, probe).test_accuracy
  tf.keras.utils.set_random_seed(config.seed)
  out[f"random_s{seed}"] = evaluation.tuned_linear_probe_fit(config.build_encoder(train.image_shape), train, val, probe).test_accuracy
  print(out, flush=True)
json.dump(out, open("/work/main/runs/pilots/baselines_validation.json", "w"), indent=1)
