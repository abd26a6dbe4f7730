"""Atomic, locked state files: corrupt content is reported with file and position, never reset."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from xaf_hub.errors import StateFileError
from xaf_hub.store.statefile import read_json, update_json, write_json_atomic


def test_atomic_write_modes_and_no_temp_left(tmp_path: Path) -> None:
    p = tmp_path / "a" / "state.json"
    write_json_atomic(p, {"x": "中文"})
    assert json.loads(p.read_text("utf-8")) == {"x": "中文"}
    if os.name == "posix":
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
        q = tmp_path / "export.json"
        write_json_atomic(q, [], private=False)
        assert stat.S_IMODE(q.stat().st_mode) == 0o644
    assert [f.name for f in p.parent.iterdir()] == ["state.json"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"a": 1,', "invalid JSON at line 1 column 9"),
        (b'{"a":\n  tru}', "invalid JSON at line 2 column 3"),
        (b'{"a": "\xff"}', "not UTF-8 text (bad byte at offset 7)"),
        (b'{"a": "x\x00"}', "contains a NUL byte at offset 8"),
    ],
)
def test_corrupt_files_are_named_and_kept(tmp_path: Path, raw: bytes, message: str) -> None:
    p = tmp_path / "pool.json"
    p.write_bytes(raw)
    with pytest.raises(StateFileError) as err:
        read_json(p, what="task pool")
    assert message in str(err.value) and str(p) in str(err.value)
    with pytest.raises(StateFileError):
        update_json(p, lambda d: d.update(b=2), default=dict, what="task pool")
    assert p.read_bytes() == raw


def test_bom_accepted_and_update_only_writes_on_change(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}')
    assert read_json(p, what="x") == {"a": 1}
    before = p.stat().st_mtime_ns
    update_json(p, lambda d: None, default=dict, what="x")
    assert p.stat().st_mtime_ns == before
    update_json(p, lambda d: d.update(a=2), default=dict, what="x")
    assert read_json(p, what="x") == {"a": 2}
