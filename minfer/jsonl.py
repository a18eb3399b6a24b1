"""Dataclass records as JSON lines: how traces and workloads are saved, shared and replayed.

One record per line, so a file can be appended to, streamed, and read with any tool. Loading keeps only
the fields the dataclass knows, so a file written by a newer minfer (with more fields) still loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def save_jsonl(records: Iterable[Any], path: str | Path) -> None:
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(asdict(record)) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of the file, as the dicts it holds."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_jsonl(cls: type[T], path: str | Path) -> list[T]:
    names = {f.name for f in fields(cls)}
    return [cls(**{k: v for k, v in row.items() if k in names}) for row in read_jsonl(path)]
