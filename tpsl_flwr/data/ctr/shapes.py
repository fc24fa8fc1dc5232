"""Shape of the public CTR data sets, for the synthetic file generators.

Criteo: per-column rates of missing values and zeros and the log-scale location
and spread of the counts ``I1..I13``, and the category counts and missing rates of
``C1..C26``, approximating the published statistics of the 45.8M-row Display
Advertising Challenge training file. Avazu: category counts of its 40.4M-row
``train.csv`` and typical values of its integer-coded columns. Which columns carry
signal in the generated labels is a choice of the generator, not a fact about
the data.
"""

from __future__ import annotations

__all__ = [
    "AVAZU_EFFECTS",
    "AVAZU_INT_BASE",
    "AVAZU_VALUES",
    "AVAZU_VOCAB",
    "CRITEO_CATEGORICAL_SHAPE",
    "CRITEO_EFFECTS",
    "CRITEO_NUMERIC_SHAPE",
]

# (missing rate, zero rate, log of the median positive count, log-scale sd, share
# of negative values) of I1..I13.
CRITEO_NUMERIC_SHAPE = (
    (0.45, 0.35, 1.0, 1.4, 0.0),
    (0.00, 0.15, 1.5, 2.0, 0.04),
    (0.21, 0.05, 2.0, 1.8, 0.0),
    (0.22, 0.05, 1.6, 1.1, 0.0),
    (0.026, 0.01, 7.8, 2.2, 0.0),
    (0.22, 0.10, 3.5, 1.9, 0.0),
    (0.04, 0.20, 1.3, 1.7, 0.0),
    (0.0005, 0.03, 2.0, 1.2, 0.0),
    (0.04, 0.02, 3.6, 1.5, 0.0),
    (0.45, 0.40, 0.3, 0.6, 0.0),
    (0.04, 0.25, 0.5, 1.0, 0.0),
    (0.76, 0.55, 0.5, 1.3, 0.0),
    (0.22, 0.05, 1.4, 1.1, 0.0),
)
# (categories, missing rate) of C1..C26 in the full training file.
CRITEO_CATEGORICAL_SHAPE = (
    (1460, 0.0),
    (583, 0.0),
    (10_131_227, 0.034),
    (2_202_608, 0.034),
    (305, 0.0),
    (24, 0.12),
    (12_517, 0.0),
    (633, 0.0),
    (3, 0.0),
    (93_145, 0.0),
    (5683, 0.0),
    (8_351_593, 0.034),
    (3194, 0.0),
    (27, 0.0),
    (14_992, 0.0),
    (5_461_306, 0.034),
    (10, 0.0),
    (5652, 0.0),
    (2173, 0.44),
    (4, 0.44),
    (7_046_547, 0.034),
    (18, 0.76),
    (15, 0.0),
    (286_181, 0.034),
    (105, 0.44),
    (142_572, 0.44),
)
CRITEO_EFFECTS = (0, 1, 4, 5, 6, 7, 8, 10, 13, 16, 19, 21, 22, 24)
"""Categorical columns (0-based) whose frequent tokens move the logit."""
AVAZU_VOCAB = {
    "C1": 7, "banner_pos": 7, "site_id": 4737, "site_domain": 7745,
    "site_category": 26, "app_id": 8552, "app_domain": 559, "app_category": 36,
    "device_id": 2_686_408, "device_ip": 6_729_486, "device_model": 8251,
    "device_type": 5, "device_conn_type": 4, "C14": 2626, "C15": 8, "C16": 9,
    "C17": 435, "C18": 4, "C19": 68, "C20": 172, "C21": 60,
}  # fmt: skip
AVAZU_VALUES = {
    "C1": (1005, 1002, 1010, 1012, 1007, 1001, 1008),
    "banner_pos": (0, 1, 7, 2, 4, 5, 3),
    "device_type": (1, 0, 4, 5, 2),
    "device_conn_type": (0, 2, 3, 5),
    "C15": (320, 300, 216, 728, 120, 1024, 480, 768),
    "C16": (50, 250, 36, 480, 90, 20, 768, 1024, 320),
    "C18": (0, 3, 2, 1),
}
AVAZU_INT_BASE = {"C14": 15_700, "C17": 1_700, "C19": 35, "C20": 100_000, "C21": 23}
AVAZU_EFFECTS = (
    "C1", "banner_pos", "site_id", "site_category", "app_id", "app_category",
    "device_model", "device_type", "device_conn_type", "C14", "C15", "C16", "C17",
    "C18", "C19", "C21",
)  # fmt: skip
