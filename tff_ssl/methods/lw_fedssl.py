"""LW-FedSSL (Ye et al.): FedMoCo-LW (stage s trains and exchanges ViT block s and the heads, blocks < s
frozen, block s starts from block s - 1) + server-side calibration (after each round's aggregation
the server trains blocks 1..s and the heads end to end with the same SSL loss and local-training
settings on its auxiliary images, `--auxiliary_fraction` (10%) of the training images that no client
holds) + representation alignment (each client's loss adds beta * InfoNCE between its local encoder's
and the broadcast encoder's features, `--alignment_weight` beta = 0.01). Clients download blocks 1..s,
upload block s and the heads (`tff_ssl.methods.layerwise`). With `--ssl=mocov3`, as in the paper."""

from tff_ssl.methods import layerwise

METHOD = layerwise.method(
    "lw_fedssl", layerwise.LayerwiseConfig(schedule="layerwise", calibration=True, alignment=True),
    "LW-FedSSL: layer-wise stages + server-side calibration on an auxiliary split + "
    "representation alignment.")
