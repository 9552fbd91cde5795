"""Evaluation of pretrained encoders: linear probes (LARS; tuned logistic regression), kNN monitor,
fine-tuning, supervised-from-scratch baseline."""

from tff_ssl.evaluation.protocols import (FROZEN_FEATURE_PROTOCOLS, PROTOCOLS, FineTuneConfig,
                                          KNNConfig, LinearProbeConfig, ProbeFit,
                                          TunedLinearProbeConfig, evaluate, extract_features,
                                          fine_tune, knn_classify, knn_monitor, labeled_subset,
                                          linear_probe, raw_pixels, supervised_from_scratch,
                                          train_linear_classifier, tune_linear_classifier,
                                          tuned_linear_probe, tuned_linear_probe_fit)
