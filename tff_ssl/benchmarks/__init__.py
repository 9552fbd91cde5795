"""The benchmarks `bin/benchmark` runs, one module each:

  rounds          round time of reference vs grouped simulation vs the centralized (or sequential)
                  equivalent, per scenario; `--profile`: where a grouped DCCO round's time goes
                                                                   (tff_ssl/benchmarks/rounds.py)
  workers         the grouped round locally and across 1, 2, ... TFF worker services, with the bytes
                  each round moves (`--workers`, `--local_workers`)  (tff_ssl/benchmarks/workers.py)
  aggregation     one aggregation of the clients' updates by each strategy (`--aggregation`)
                                                              (tff_ssl/benchmarks/aggregation.py)
  layerwise_cost  what a client pays per stage of layer-wise training: bytes, FLOPs, peak memory
                  (`--layerwise`; the LW-FedSSL table's cost appendix)
                                                           (tff_ssl/benchmarks/layerwise_cost.py)

`common.py` holds what they share: the round scenarios (`Scenario`, `SCENARIOS`; each scenario's
process is built by its method's registry entry, `tff_ssl.methods`, from an `ExperimentConfig`), the
models timed, and the timing helpers.
"""
