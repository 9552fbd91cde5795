"""Data: image sources, client partitions, federated client data and two-view augmentations."""

from tff_ssl.data.augment import AugmentConfig, augment, to_float, two_views
from tff_ssl.data.partition import (PARTITIONS, Partition, classes_per_client_partition,
                                    dirichlet_label_split, dirichlet_partition, iid_partition)
from tff_ssl.data.sources import (SOURCES, UNLABELED, DataUnavailableError, ImageSet, image_shape,
                                  load, synthetic)
