"""pyarrow's streaming CSV reader over a plain or gzip CTR file.

pyarrow's own parser is single threaded, so that every row keeps its physical
line number: a line with the wrong number of fields is reported as ``line N:
expected K fields, got M``. Every column is read as raw bytes (no UTF-8 check, no
type inference, no quoting: the public CTR files have none); ``.gz`` (recognised
by its magic bytes, whatever the name) goes through a streaming decompressor.
Blank lines are not skipped, so line numbers stay physical and a blank line is
reported as a bad row. :meth:`Reader.chunks` hands each chunk over with the
reader's bad-row record as it stood when that chunk was read: a caller that
reads ahead (to encode chunks in a thread pool) then reports errors exactly as a
sequential read does.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Collection, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from tpsl_flwr.data.ctr.formats import CTRFormat
from tpsl_flwr.errors import ConfigError

__all__ = [
    "BLOCK_BYTES",
    "ReadState",
    "Reader",
    "csv_options",
    "first_line",
]

BLOCK_BYTES = 2 << 20
"""Bytes of text parsed per chunk (1-4 MiB measured alike; 16 MiB slower)."""


@dataclass(frozen=True)
class ReadState:
    """The reader's record of malformed rows, as it stood after one chunk.

    Parameters
    ----------
    skipped : int
        Rows with the wrong number of fields skipped so far.
    bad_row : object
        pyarrow's description of the first such row (None if none yet).
    first_bad : str
        That row described for a message (``""`` if none yet).
    """

    skipped: int = 0
    bad_row: Any = None
    first_bad: str = ""


def first_line(path: Path) -> str:
    """The first line of a plain or gzip file (at most 64 KiB), without newline."""
    with _open_text(path) as f:
        head = f.read(1 << 16)
    return head.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", errors="replace")


class Reader:
    """pyarrow's streaming CSV reader over one file, with errors translated.

    Parameters
    ----------
    path : Path
        The file (plain or gzip).
    fmt : CTRFormat
        Its layout; the header line, if any, is skipped (checked elsewhere).
    columns : collection of str, optional
        File columns to convert (default: the label, time and feature columns).
        Every line is still split into fields (so a line with the wrong number of
        fields is caught whatever is converted), but only these columns are
        handed over: a reader that must not see the label leaves it out.
    """

    def __init__(
        self, path: Path, fmt: CTRFormat, columns: Collection[str] | None = None
    ) -> None:
        self.path = path
        self.fmt = fmt
        if columns is None:
            columns = {fmt.label, *fmt.numeric, *fmt.categorical}
            columns |= {fmt.time} if fmt.time else set()
        unknown = sorted(set(columns) - set(fmt.columns))
        if unknown or not columns:
            raise ConfigError(
                f"columns to read must be {fmt.name} columns, got {sorted(columns)}"
            )
        self.columns = frozenset(columns)
        self.skipped = 0
        self.first_bad = ""
        self._bad_row: Any = None

    def _on_invalid(self, row: Any) -> str:
        # Always skip here and report after the chunk, so that a bad value on an
        # earlier line of the same chunk is reported first.
        if self._bad_row is None:
            self._bad_row = row
            self.first_bad = self._describe(row)
        self.skipped += 1
        return "skip"

    def state(self) -> ReadState:
        """The record of malformed rows so far."""
        return ReadState(self.skipped, self._bad_row, self.first_bad)

    def raise_first(
        self,
        error: tuple[str, int, str] | None,
        lines_before: int,
        last_line: int | None = None,
        state: ReadState | None = None,
    ) -> None:
        """Raise for the earliest problem so far: a bad field or a bad row.

        Parameters
        ----------
        error : tuple or None
            ``(column, row in chunk, why)`` of the chunk's first bad field.
        lines_before : int
            The physical line just before the chunk. Rows before the first
            field-count failure are never skipped, so a bad field's line is exact
            whenever it comes first.
        last_line : int, optional
            Ignore problems past this line (the rows asked for end there).
        state : ReadState, optional
            The bad-row record to judge by (default: the reader's current one):
            the one handed over with the chunk when chunks are read ahead.

        Raises
        ------
        ConfigError
            Naming the line (and the column of a bad field).
        """
        if state is None:
            state = self.state()
        limit = last_line if last_line is not None else float("inf")
        bad_line = state.bad_row.number if state.bad_row is not None else None
        if bad_line is not None and bad_line > limit:
            bad_line = None
        if error is not None:
            column, i, why = error
            line = lines_before + i + 1
            if line <= limit and (bad_line is None or line < bad_line):
                raise ConfigError(f"{self.path}, line {line}, column {column}: {why}")
        if bad_line is not None:
            raise ConfigError(f"{self.path}, {state.first_bad}")

    def _describe(self, row: Any) -> str:
        sep = "tab" if self.fmt.delimiter == "\t" else repr(self.fmt.delimiter)
        text = row.text if len(row.text) <= 60 else row.text[:60] + "..."
        return (
            f"line {row.number}: expected {row.expected_columns} {sep}-separated "
            f"fields ({self.fmt.name} format), got {row.actual_columns}: {text!r}"
        )

    def chunks(self) -> Generator[tuple[pa.RecordBatch, ReadState], None, None]:
        """Yield ``(batch, state)``: each batch with the bad-row record as it was.

        ``state`` is the record right after ``batch`` was read, what
        :meth:`raise_first` must judge that chunk by once later chunks have been
        read too.
        """
        for batch in self.batches():
            yield batch, self.state()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Yield record batches; raise :class:`ConfigError` on a malformed row."""
        fmt = self.fmt
        read, parse, convert = csv_options(fmt, self.columns, self._on_invalid)
        source = _open_arrow(self.path)
        try:
            try:
                reader = pacsv.open_csv(source, read, parse, convert)
            except StopIteration:
                return
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                yield batch
        except (pa.ArrowException, OSError) as exc:  # e.g. a truncated gzip stream
            if "Empty CSV file" in str(exc):
                return
            raise ConfigError(
                f"{self.path}: cannot read as {fmt.name}: {exc}"
            ) from None
        finally:
            source.close()


def csv_options(
    fmt: CTRFormat,
    columns: Collection[str],
    on_invalid: Callable[[Any], str] | None = None,
) -> tuple[pacsv.ReadOptions, pacsv.ParseOptions, pacsv.ConvertOptions]:
    """The CSV options of pyarrow for reading ``columns`` of a ``fmt`` file as bytes.

    What :meth:`Reader.batches` passes to ``pyarrow.csv.open_csv`` (and what
    ``bench/loader.py`` times as pyarrow's parse-only baseline): the
    single-threaded streaming parser, :data:`BLOCK_BYTES` per chunk, no quoting,
    blank lines kept, every converted column as raw bytes.

    Parameters
    ----------
    fmt : CTRFormat
        The layout.
    columns : collection of str
        The file columns to convert.
    on_invalid : callable, optional
        pyarrow's ``invalid_row_handler`` (None: a malformed row is an error).

    Returns
    -------
    tuple
        ``(read_options, parse_options, convert_options)``.
    """
    read = pacsv.ReadOptions(
        column_names=list(fmt.columns),
        skip_rows=fmt.line_offset,
        use_threads=False,
        block_size=BLOCK_BYTES,
    )
    parse = pacsv.ParseOptions(
        delimiter=fmt.delimiter,
        quote_char=False,
        ignore_empty_lines=False,
        invalid_row_handler=on_invalid,
    )
    convert = pacsv.ConvertOptions(
        column_types={c: pa.binary() for c in fmt.columns},
        include_columns=[c for c in fmt.columns if c in columns],
        strings_can_be_null=False,
    )
    return read, parse, convert


def _is_gzip(path: Path) -> bool:
    """Whether the file starts with gzip's magic bytes."""
    with path.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _open_arrow(path: Path) -> pa.NativeFile:
    """An Arrow input stream, decompressing gzip on the fly."""
    raw = pa.OSFile(str(path), "rb")
    return pa.CompressedInputStream(raw, "gzip") if _is_gzip(path) else raw


def _open_text(path: Path) -> Any:
    """A binary file object, gzip-decompressing when needed."""
    return gzip.open(path, "rb") if _is_gzip(path) else path.open("rb")
