"""A wheel's RECORD: every file's sha256 and size, as the wheel spec defines them."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile


def record_hash(data: bytes) -> str:
    """``sha256=<urlsafe base64 without padding>``, RECORD's hash notation."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def matches(data: bytes, digest: str, size: str) -> bool:
    """Does ``data`` have the hash and size a RECORD row states?"""
    return digest == record_hash(data) and size.isdigit() and int(size) == len(data)


def read_record(wheel: zipfile.ZipFile) -> tuple[str, dict[str, tuple[str, str]]]:
    """The RECORD's name in the wheel and its rows, name -> (hash, size); RECORD's own row is empty."""
    name = next((n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")), None)
    if name is None:
        raise ValueError(f"{wheel.filename}: no .dist-info/RECORD")
    rows = {}
    for n, row in enumerate(csv.reader(io.StringIO(wheel.read(name).decode())), 1):
        if len(row) != 3:
            raise ValueError(f"{wheel.filename}: {name} row {n} has {len(row)} fields, expected 3")
        rows[row[0]] = (row[1], row[2])
    return name, rows
