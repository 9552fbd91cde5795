"""SimCLR (Chen et al., 2020): NT-Xent between the two views' projections within the client's batch."""

from __future__ import annotations

from tff_ssl import losses
from tff_ssl.losses import per_client
from tff_ssl.ssl.base import SSLMethod

METHOD = SSLMethod(
    name="simclr",
    loss=lambda o, hp: losses.nt_xent_loss(o.z1, o.z2, temperature=hp.temperature),
    per_client_loss=lambda o, sizes, hp: per_client.nt_xent_loss_per_client(
        o.z1, o.z2, sizes, temperature=hp.temperature),
    hparams=("temperature",),
    # --head_norm=batch: SimCLR: BN in the projector's hidden layers.
    batch_heads="hidden")
