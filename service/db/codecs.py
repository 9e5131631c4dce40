"""How numbers travel to and from Postgres: metadata floats in JSONB, ``real`` values and
arrays, cosine distances, stored factor rows, and binary COPY streams (built and parsed in
numpy, with no per-row Python)."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format

# A JSON string, or a number in exponent form with a positive exponent: json.dumps writes
# every float from 1e16 up (and no int) that way.
_STRING_OR_LARGE_FLOAT = re.compile(r'"(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?e\+[0-9]+')


def metadata_json(metadata: dict[str, Any]) -> str:
    """JSON text of a metadata object in which every float reads back from JSONB as a float.

    JSONB stores numbers as numeric, which prints 1e308 (from json.dumps's "1e+308") as a
    309-digit integer, so it read back as an int. Such floats are written out in full with a
    ".0", which numeric keeps; the decimal is exact, so it reads back as the same float."""
    text = json.dumps(metadata)
    if "e+" not in text:
        return text
    return _STRING_OR_LARGE_FLOAT.sub(
        lambda match: match[0] if match[0].startswith('"') else f"{float(match[0]):.1f}", text
    )


def real_values(values: np.ndarray) -> np.ndarray:
    """Values for a Postgres ``real`` column: float32, with magnitudes below float32's smallest
    normal flushed to zero (Postgres rejects subnormal ``real`` input as out of range, and ALS
    can drive an unused factor arbitrarily close to zero)."""
    single = np.asarray(values, dtype=np.float32)
    return np.where(np.abs(single) < np.finfo(np.float32).tiny, np.float32(0.0), single)


def as_real(values: np.ndarray) -> list[float]:
    """:func:`real_values` as a list of Python floats."""
    real: list[float] = real_values(values).tolist()
    return real


def real_as_read(values: np.ndarray) -> np.ndarray:
    """The float64 values reading :func:`real_values` back from a ``real`` column gives (in text
    format, as every read here but the COPYs: each float32's shortest decimal)."""
    return real_values(values).astype(str).astype(np.float64)


def real_array_literals(rows: np.ndarray) -> list[str]:
    """Rows of a 2-D array as ``'{...}'`` literals for a ``real[]`` column (Postgres has no
    ragged 2-D arrays, so each row travels as text)."""
    return ["{" + ",".join(map(repr, row)) + "}" for row in real_values(rows).tolist()]


def array_literal(values: np.ndarray) -> str:
    """A 1-D array of numbers as one ``'{...}'`` literal, for a ``bigint[]`` or ``float8[]``
    parameter cast in SQL: the same numbers a list parameter sends (``repr`` of each, which
    reads back exactly), built in one join instead of psycopg's list dumper, which dumps each
    element in Python (a few of these per retrieve)."""
    return "{" + ",".join(map(repr, np.asarray(values).tolist())) + "}"


_FLOAT8_OID = 701
_FLOAT8_ARRAY_OID = 1022


@dataclass(frozen=True)
class Float8Rows:
    """The rows of a 2-D float64 array (a 1-D array: one row) as one flat ``float8[]``
    parameter, built in binary by numpy (formatting a retrieve's ~2,000 floats as text took
    ~1 ms, psycopg's list dumper ~0.3 ms): row i (from 1) of rows ``width`` wide is the slice
    ``[(i - 1) * width + 1 : i * width]`` in SQL. Sent by :class:`Float8RowsDumper`, which the
    engine registers on every connection; values arrive exactly."""

    data: bytes  # the array's binary form

    @classmethod
    def of(cls, rows: np.ndarray) -> Float8Rows:
        values = np.asarray(rows, dtype=np.float64)
        elements = np.zeros(values.size, dtype=[("length", ">i4"), ("value", ">f8")])
        elements["length"] = 8
        elements["value"] = values.ravel()
        # ndim, has-nulls, element oid, then the one dimension's size and lower bound
        header = struct.pack(">iiiii", 1, 0, _FLOAT8_OID, values.size, 1)
        return cls(header + elements.tobytes())


class Float8RowsDumper(Dumper):
    format = Format.BINARY
    oid = _FLOAT8_ARRAY_OID

    def dump(self, obj: Float8Rows) -> bytes:
        return obj.data


class Float8ArrayLoader(Loader):
    """A ``float8[]`` read in binary as a numpy float64 array, decoded by numpy in one call
    (psycopg builds a Python float per element: 35 rows of packed statistics, ~1,900 floats, were
    most of the CPU of reading them). One dimension, no NULL elements (what a packed row is);
    anything else is refused, never misread. For a cursor that reads in binary
    (:func:`float8_arrays_as_numpy`)."""

    format = Format.BINARY

    def load(self, data: Any) -> np.ndarray:
        ndim, has_nulls, oid = struct.unpack_from(">iii", data)
        if ndim == 0:
            return np.zeros(0)
        size = struct.unpack_from(">i", data, 12)[0]
        if ndim != 1 or has_nulls or oid != _FLOAT8_OID:
            raise psycopg.DataError("expected a one-dimensional float8[] without NULLs")
        elements = np.frombuffer(data, dtype=[("length", ">i4"), ("value", ">f8")],
                                 count=size, offset=20)
        return elements["value"].astype(np.float64)


def float8_arrays_as_numpy(cursor: psycopg.AsyncCursor[Any]) -> psycopg.AsyncCursor[Any]:
    """``cursor``, its ``float8[]`` results read by :class:`Float8ArrayLoader` (in binary)."""
    cursor.adapters.register_loader(_FLOAT8_ARRAY_OID, Float8ArrayLoader)
    return cursor


def double_array_literals(rows: np.ndarray) -> list[str]:
    """Rows of a 2-D array as ``'{...}'`` literals for a ``float8[]`` column, each value in the
    shortest form that reads back as the same float64."""
    return ["{" + ",".join(repr(float(x)) for x in row) + "}" for row in rows]


def cosine_similarities(distances: Sequence[float]) -> np.ndarray:
    """1 - pgvector's cosine distances, 0 (orthogonal) where a distance is NaN: pgvector's
    answer for a vector of zero length (or one whose float32 squared length overflows), which
    ingest refuses but older rows may have."""
    similarities = 1.0 - np.asarray(distances, dtype=np.float64)
    return np.where(np.isnan(similarities), 0.0, similarities)


def factor_matrix(factor_lists: Sequence[Sequence[float] | None], rank: int) -> np.ndarray:
    """Stored factor arrays as an (n, rank) matrix; missing or other-rank rows become zeros
    (a changed EARM_RANK is healed by the next full refit)."""
    matrix = np.zeros((len(factor_lists), rank))
    for row, factors in enumerate(factor_lists):
        if factors is not None and len(factors) == rank:
            matrix[row] = factors
    return matrix


# Binary COPY framing (https://www.postgresql.org/docs/current/sql-copy.html#id-1.9.3.55.9.4).
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_HEADER = _COPY_SIGNATURE + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_FLOAT4_OID = 700
# Array columns: element type in the stream, its OID and size.
_ARRAY_ELEMENTS = {"real[]": (">f4", _FLOAT4_OID, 4), "float8[]": (">f8", 701, 8)}


def parse_binary_copy(data: bytes, row: np.dtype) -> np.ndarray:
    """Rows of a binary COPY whose every field is fixed-size and non-NULL."""
    if not data.startswith(_COPY_SIGNATURE):
        raise ValueError("not a binary COPY stream")
    extension = struct.unpack_from(">i", data, len(_COPY_SIGNATURE) + 4)[0]
    start = len(_COPY_SIGNATURE) + 8 + extension
    body = data[start : len(data) - len(_COPY_TRAILER)]
    rows = np.frombuffer(body, dtype=row)
    assert row.fields is not None and row.names is not None, "row is a structured dtype"
    sizes = [row.fields[name][0].itemsize for name in row.names[2::2]]
    lengths = [row.names[i] for i in range(1, len(row.names), 2)]
    if len(body) % row.itemsize or np.any(rows["fields"] != len(sizes)) or any(
        np.any(rows[name] != size) for name, size in zip(lengths, sizes, strict=True)
    ):
        raise ValueError("unexpected row layout in a binary COPY stream")
    return rows


def binary_copy(columns: Sequence[tuple[str, Any]], n_rows: int) -> bytes:
    """A binary COPY stream of ``n_rows`` rows, built in numpy (no per-row Python).

    Columns are (kind, values): ``int8``, ``int4``, ``float8`` (arrays of ``n_rows``), ``text``
    (one ``str`` for every row), ``real[]`` (an (n_rows, r) array, written as float32) or
    ``float8[]`` (likewise, as float64).
    """
    fields: list[tuple[Any, ...]] = [("fields", ">i2")]
    for i, (kind, values) in enumerate(columns):
        fields.append((f"l{i}", ">i4"))
        if kind == "int8":
            fields.append((f"v{i}", ">i8"))
        elif kind == "int4":
            fields.append((f"v{i}", ">i4"))
        elif kind == "float8":
            fields.append((f"v{i}", ">f8"))
        elif kind == "text":
            fields.append((f"v{i}", f"S{len(values.encode())}"))
        elif kind in _ARRAY_ELEMENTS:
            rank = values.shape[1]
            fields.append((f"h{i}", ">i4", (5,)))  # ndim, has-nulls, element oid, size, lbound
            element = _ARRAY_ELEMENTS[kind][0]
            fields.append((f"v{i}", [("length", ">i4"), ("value", element)], (rank,)))
        else:  # pragma: no cover - programming error
            raise ValueError(f"unknown column kind {kind!r}")
    rows = np.zeros(n_rows, dtype=np.dtype(fields))
    rows["fields"] = len(columns)
    for i, (kind, values) in enumerate(columns):
        if kind == "text":
            encoded = values.encode()
            rows[f"l{i}"] = len(encoded)
            rows[f"v{i}"] = encoded
        elif kind in _ARRAY_ELEMENTS:
            rank = values.shape[1]
            _, oid, size = _ARRAY_ELEMENTS[kind]
            rows[f"l{i}"] = 20 + (4 + size) * rank
            rows[f"h{i}"] = (1, 0, oid, rank, 1)
            rows[f"v{i}"]["length"] = size
            rows[f"v{i}"]["value"] = real_values(values) if kind == "real[]" else values
        else:
            rows[f"l{i}"] = rows.dtype[f"v{i}"].itemsize
            rows[f"v{i}"] = values
    return _COPY_HEADER + rows.tobytes() + _COPY_TRAILER


async def copy_in(conn: psycopg.AsyncConnection[Any], statement: str, data: bytes) -> None:
    async with conn.cursor() as cursor, cursor.copy(statement) as copy:
        await copy.write(data)
