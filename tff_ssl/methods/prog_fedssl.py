"""Prog-FedSSL (LW-FedSSL's progressive variant): stage s trains and exchanges ViT blocks 1..s and the
heads; block s starts from block s - 1 (`tff_ssl.methods.layerwise`). With `--ssl=mocov3`, as in
the paper."""

from tff_ssl.methods import layerwise

METHOD = layerwise.method(
    "prog_fedssl", layerwise.LayerwiseConfig(schedule="progressive"),
    "Prog-FedSSL: progressive stages, blocks 1..s and the heads trained in stage s.")
