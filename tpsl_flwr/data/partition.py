"""Vertical partitioning: which feature columns each non-label party holds.

Every column goes to exactly one party. The default is balanced and deterministic:
columns are dealt round-robin, numeric columns first and then categorical ones, with
one running counter, so party sizes differ by at most one overall *and* within each
column type (every party gets a mix when there are enough columns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tpsl_flwr.data.tabular import PartyFeatures, TabularData
from tpsl_flwr.errors import ConfigError

__all__ = ["PartyColumns", "partition_columns", "party_features"]


@dataclass(frozen=True)
class PartyColumns:
    """The column names one non-label party holds.

    Parameters
    ----------
    party : int
        Party index in ``[0, num_parties)``.
    numeric, categorical : tuple of str
        The party's numeric and categorical column names, in table order.
    """

    party: int
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.numeric) + len(self.categorical)

    @property
    def names(self) -> tuple[str, ...]:
        """All of the party's column names: numeric first, then categorical."""
        return self.numeric + self.categorical


def partition_columns(
    numeric_names: Sequence[str],
    categorical_names: Sequence[str],
    num_parties: int,
    assignment: Mapping[str, int] | None = None,
) -> list[PartyColumns]:
    """Split the feature columns among ``num_parties`` non-label parties.

    Parameters
    ----------
    numeric_names, categorical_names : sequence of str
        The table's column names.
    num_parties : int
        Number of non-label parties, at least 1 and at most the number of columns.
    assignment : mapping of str to int, optional
        Party index of every column, by name. ``None`` (default) deals the columns
        round-robin: numeric first, then categorical, one running counter.

    Returns
    -------
    list of PartyColumns
        One entry per party, in party order; within a party, columns keep table
        order.

    Raises
    ------
    ConfigError
        If ``num_parties`` < 1 or exceeds the number of columns, a column name is
        repeated, ``assignment`` names an unknown column, misses a column or uses a
        party index out of range, or a party is left with no columns.

    Examples
    --------
    >>> parts = partition_columns(["a", "b", "c"], ["x", "y"], 2)
    >>> [p.names for p in parts]
    [('a', 'c', 'y'), ('b', 'x')]
    """
    numeric = tuple(numeric_names)
    categorical = tuple(categorical_names)
    every = numeric + categorical
    if len(set(every)) != len(every):
        dupes = sorted({c for c in every if every.count(c) > 1})
        raise ConfigError(f"column names must be unique, got duplicates {dupes}")
    if isinstance(num_parties, bool) or not isinstance(num_parties, int):
        raise ConfigError(f"num_parties must be an int, got {num_parties!r}")
    if num_parties < 1:
        raise ConfigError(f"num_parties must be >= 1, got {num_parties}")
    if num_parties > len(every):
        raise ConfigError(
            f"num_parties={num_parties} exceeds the number of columns ({len(every)})"
        )
    if assignment is None:
        owner = {name: i % num_parties for i, name in enumerate(every)}
    else:
        owner = _check_assignment(assignment, every, num_parties)
    parts = [
        PartyColumns(
            party=p,
            numeric=tuple(c for c in numeric if owner[c] == p),
            categorical=tuple(c for c in categorical if owner[c] == p),
        )
        for p in range(num_parties)
    ]
    empty = [p.party for p in parts if len(p) == 0]
    if empty:
        raise ConfigError(f"parties {empty} would hold no columns")
    return parts


def _check_assignment(
    assignment: Mapping[str, int], every: tuple[str, ...], num_parties: int
) -> dict[str, int]:
    """Validate an explicit column -> party map against the table's columns."""
    unknown = sorted(set(assignment) - set(every))
    if unknown:
        raise ConfigError(f"assignment names unknown columns {unknown}")
    missing = [c for c in every if c not in assignment]
    if missing:
        raise ConfigError(f"assignment misses columns {missing}")
    for name, party in assignment.items():
        if isinstance(party, bool) or not isinstance(party, int):
            raise ConfigError(f"party of column {name!r} must be an int, got {party!r}")
        if not 0 <= party < num_parties:
            raise ConfigError(
                f"party of column {name!r} must lie in [0, {num_parties}), got {party}"
            )
    return dict(assignment)


def party_features(data: TabularData, cols: PartyColumns) -> PartyFeatures:
    """Cut one party's label-free slice out of a labelled table.

    Parameters
    ----------
    data : TabularData
        The full table.
    cols : PartyColumns
        The party's columns (from :func:`partition_columns`).

    Returns
    -------
    PartyFeatures
        The party's columns for every row, without labels.

    Raises
    ------
    ConfigError
        If a column of ``cols`` is absent from ``data`` or has the other type.
    """
    wrong_num = [c for c in cols.numeric if c not in data.numeric_names]
    wrong_cat = [c for c in cols.categorical if c not in data.categorical_names]
    if wrong_num or wrong_cat:
        raise ConfigError(
            f"party {cols.party} columns not in the table with that type: "
            f"numeric {wrong_num}, categorical {wrong_cat}"
        )
    return data.features_only(cols.names)
