"""A console whose encoding cannot show every character (GBK / cp936, as on a Chinese Windows)
gets the output with those characters replaced, never a UnicodeEncodeError mid-output."""

from __future__ import annotations

import io
from pathlib import Path

from xaf_hub.cli.main import main


def gbk_stream() -> tuple[io.TextIOWrapper, io.BytesIO]:
    raw = io.BytesIO()
    return io.TextIOWrapper(raw, encoding="cp936", errors="strict", newline="\n"), raw


def test_an_emoji_on_a_gbk_console_is_replaced_and_the_chinese_kept(tmp_path: Path) -> None:
    cwd = tmp_path / "商店🚀"
    cwd.mkdir()
    out, out_raw = gbk_stream()
    err, err_raw = gbk_stream()
    code = main(["init", "--root", "/srv/店🚀"], stdout=out, stderr=err,
                env={"XAF_HUB_HOME": str(tmp_path / "h")}, cwd=cwd)
    out.flush()
    err.flush()
    assert code == 0, err_raw.getvalue().decode("cp936")
    text = out_raw.getvalue().decode("cp936")
    assert f"wrote {tmp_path}/商店?/config.json" in text
    assert (cwd / "config.json").is_file()


def test_an_error_line_on_a_gbk_console_is_replaced_too(tmp_path: Path) -> None:
    out, _ = gbk_stream()
    err, err_raw = gbk_stream()
    code = main(["--config", str(tmp_path / "无🚀.json"), "status"], stdout=out, stderr=err,
                env={"XAF_HUB_HOME": str(tmp_path / "h")}, cwd=tmp_path)
    err.flush()
    said = err_raw.getvalue().decode("cp936")
    assert code == 4 and "无?.json" in said and "internal error" not in said, said


def test_a_utf8_stream_is_left_as_it_is(tmp_path: Path) -> None:
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
    code = main(["init", "--root", "/srv/x"], stdout=out, stderr=io.StringIO(),
                env={"XAF_HUB_HOME": str(tmp_path / "h")}, cwd=tmp_path)
    out.flush()
    assert code == 0 and "wrote" in raw.getvalue().decode("utf-8")
    assert out.errors == "strict"  # only a stream that cannot show everything is changed
