"""Training loops that are not federated (the centralized baselines)."""

from tff_ssl.training.centralized import PretrainConfig, batch_indices, pretrain
