"""binary-tabular: TPSL label DP for two-party vertical split learning on Flower."""
