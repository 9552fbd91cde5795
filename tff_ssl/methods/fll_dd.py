"""FLL + depth dropout (Guo et al., 2023; LW-FedSSL's second layer-wise baseline): FedMoCo-LW's stages
(block s and the heads trained in stage s, blocks < s frozen) where, at every local step, each frozen
block is skipped with probability `--depth_dropout` (0.5, as in both papers), which saves their
forward pass (`tff_ssl.methods.layerwise`). FLL is SimCLR-based: LW-FedSSL runs it with
`--ssl=simclr` and batch 512."""

from tff_ssl.methods import layerwise

METHOD = layerwise.method(
    "fll_dd", layerwise.LayerwiseConfig(schedule="layerwise", depth_dropout=True),
    "FLL + DD: layer-wise stages, frozen blocks skipped at random (depth dropout) at local steps.")
