"""The file formats of the public CTR data sets: column names and layout.

* Criteo Display Advertising Challenge ``train.txt``: tab-separated, no header,
  ``label, I1..I13, C1..C26``; ``I*`` integer counts, ``C*`` 32-bit hashes written
  as 8 hex digits; an empty field is a missing value.
* Its Kaggle CSV variant: comma-separated with the header
  ``Id,Label,I1..I13,C1..C26``.
* Avazu ``train.csv``: comma-separated with the header
  ``id,click,hour,C1,banner_pos,site_id,...,C21``; ``hour`` is ``YYMMDDHH``; every
  other feature column is categorical (hashed).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AVAZU",
    "AVAZU_CATEGORICAL",
    "AVAZU_COLUMNS",
    "CRITEO_CATEGORICAL",
    "CRITEO_KAGGLE",
    "CRITEO_NUMERIC",
    "CRITEO_TSV",
    "CTRFormat",
]

CRITEO_NUMERIC: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
"""Criteo's 13 integer count columns."""
CRITEO_CATEGORICAL: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
"""Criteo's 26 hashed categorical columns."""
AVAZU_COLUMNS: tuple[str, ...] = (
    "id",
    "click",
    "hour",
    "C1",
    "banner_pos",
    "site_id",
    "site_domain",
    "site_category",
    "app_id",
    "app_domain",
    "app_category",
    "device_id",
    "device_ip",
    "device_model",
    "device_type",
    "device_conn_type",
    *(f"C{i}" for i in range(14, 22)),
)
"""The header of Avazu's ``train.csv``, in file order."""
AVAZU_CATEGORICAL: tuple[str, ...] = AVAZU_COLUMNS[3:]
"""Avazu columns hashed as categorical tokens (``hour`` is handled apart)."""


@dataclass(frozen=True)
class CTRFormat:
    """Layout of one CTR file format.

    Parameters
    ----------
    name : str
        Format name used in messages and cache keys.
    columns : tuple of str
        Every column of a row, in file order.
    header : bool
        Whether the first line is a header that must equal ``columns``.
    delimiter : str
        Field separator.
    label : str
        The 0/1 label column.
    numeric : tuple of str
        Integer count columns (transformed with ``sign(x) log1p|x|``).
    categorical : tuple of str
        Token columns (hashed).
    time : str or None
        A ``YYMMDDHH`` column: its hour of day becomes a categorical column of the
        same name and its day drives the time split.
    """

    name: str
    columns: tuple[str, ...]
    header: bool
    delimiter: str
    label: str
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    time: str | None = None

    @property
    def line_offset(self) -> int:
        """Physical line number of the first data row, minus one."""
        return 1 if self.header else 0


CRITEO_TSV = CTRFormat(
    name="criteo",
    columns=("label", *CRITEO_NUMERIC, *CRITEO_CATEGORICAL),
    header=False,
    delimiter="\t",
    label="label",
    numeric=CRITEO_NUMERIC,
    categorical=CRITEO_CATEGORICAL,
)
"""Criteo's ``train.txt`` (tab-separated, no header)."""
CRITEO_KAGGLE = CTRFormat(
    name="criteo-kaggle",
    columns=("Id", "Label", *CRITEO_NUMERIC, *CRITEO_CATEGORICAL),
    header=True,
    delimiter=",",
    label="Label",
    numeric=CRITEO_NUMERIC,
    categorical=CRITEO_CATEGORICAL,
)
"""Criteo's Kaggle CSV variant (header, ``Id`` column)."""
AVAZU = CTRFormat(
    name="avazu",
    columns=AVAZU_COLUMNS,
    header=True,
    delimiter=",",
    label="click",
    numeric=(),
    categorical=AVAZU_CATEGORICAL,
    time="hour",
)
"""Avazu's ``train.csv``."""
