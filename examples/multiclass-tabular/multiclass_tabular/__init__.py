"""multiclass-tabular: TPSL label DP, 4 classes, two-party vertical split learning."""
