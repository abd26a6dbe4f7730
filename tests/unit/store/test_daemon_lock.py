"""One patrol daemon per state folder: a second is refused naming the first one's pid; what a
killed daemon leaves behind (its pid file, the lock file) never blocks the next one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from xaf_hub.errors import BusyError, ExitCode
from xaf_hub.store.patrol_state import DAEMON_LOCK, DAEMON_PID, daemon_lock

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    with daemon_lock(tmp_path, NOW):
        doc = json.loads((tmp_path / DAEMON_PID).read_text("utf-8"))
        assert doc["pid"] == os.getpid() and doc["started_at"] == "2026-12-03T12:00:00+00:00"
        with pytest.raises(BusyError) as caught, daemon_lock(tmp_path, NOW):
            pytest.fail("a second daemon got the lock")
        assert caught.value.exit_code == ExitCode.BUSY
        message = str(caught.value)
        assert f"pid {os.getpid()}" in message and f"kill {os.getpid()}" in message
        assert str(tmp_path / DAEMON_LOCK) in message and "\n" not in message
        # The refused one did not touch the holder's pid file.
        assert json.loads((tmp_path / DAEMON_PID).read_text("utf-8"))["pid"] == os.getpid()
    assert not (tmp_path / DAEMON_PID).exists()  # a clean stop removes it
    with daemon_lock(tmp_path, NOW):  # and the lock is free again
        pass


def test_a_stale_pid_file_and_lock_file_do_not_block(tmp_path: Path) -> None:
    (tmp_path / DAEMON_PID).write_text(json.dumps({"pid": 999999, "host": "x"}), "utf-8")
    (tmp_path / DAEMON_LOCK).write_bytes(b"")
    with daemon_lock(tmp_path, NOW):
        assert json.loads((tmp_path / DAEMON_PID).read_text("utf-8"))["pid"] == os.getpid()


def test_the_lock_of_a_killed_process_is_free(tmp_path: Path) -> None:
    """The OS releases the lock with the process: a SIGKILLed holder leaves nothing that blocks."""
    code = (
        "import sys, time; from datetime import datetime, UTC; from pathlib import Path\n"
        "from xaf_hub.store.patrol_state import daemon_lock\n"
        "with daemon_lock(Path(sys.argv[1]), datetime.now(UTC)):\n"
        "    print('held', flush=True); time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        with pytest.raises(BusyError, match=f"pid {proc.pid}"), daemon_lock(tmp_path, NOW):
            pass
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert (tmp_path / DAEMON_PID).exists()  # left behind by the killed holder
    with daemon_lock(tmp_path, NOW):
        assert json.loads((tmp_path / DAEMON_PID).read_text("utf-8"))["pid"] == os.getpid()


def test_a_holder_without_a_pid_file_yet_is_still_named_as_running(tmp_path: Path) -> None:
    from xaf_hub.store.statefile import file_lock

    with (
        file_lock(tmp_path / DAEMON_LOCK, 0),
        pytest.raises(BusyError, match="pid not yet written"),
        daemon_lock(tmp_path, NOW),
    ):
        pass


def test_a_holder_on_another_host_sharing_the_folder_is_named_with_its_host(
    tmp_path: Path,
) -> None:
    from xaf_hub.store.statefile import file_lock

    (tmp_path / DAEMON_PID).write_text(
        json.dumps({"pid": 4242, "host": "build-02.invalid", "started_at": "2026-12-03T11:00"}),
        "utf-8",
    )
    with (
        file_lock(tmp_path / DAEMON_LOCK, 0),
        pytest.raises(BusyError, match=r"\(pid 4242 on build-02.invalid, started 2026-12-03T11"),
        daemon_lock(tmp_path, NOW),
    ):
        pass
