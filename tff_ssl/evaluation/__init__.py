"""Evaluation of pretrained encoders: linear probe, fine-tuning, supervised-from-scratch baseline."""

from tff_ssl.evaluation.protocols import (FineTuneConfig, LinearProbeConfig, extract_features,
                                          fine_tune, labeled_subset, linear_probe,
                                          supervised_from_scratch, train_linear_classifier)
