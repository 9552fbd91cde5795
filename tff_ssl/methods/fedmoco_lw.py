"""FedMoCo-LW (LW-FedSSL's layer-wise baseline): stage s trains and exchanges ViT block s and the heads,
blocks < s frozen; block s starts from block s - 1 (`tff_ssl.methods.layerwise`). With
`--ssl=mocov3`, as in the paper."""

from tff_ssl.methods import layerwise

METHOD = layerwise.method(
    "fedmoco_lw", layerwise.LayerwiseConfig(schedule="layerwise"),
    "FedMoCo-LW: layer-wise stages, block s and the heads trained in stage s.")
