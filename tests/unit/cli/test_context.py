"""The run context's printing: every table cell is redacted, as every line is."""

from __future__ import annotations

import argparse
import io

from xaf_hub.cli.context import Context

SECRET = "s3cret-Passw0rd"


def _ctx(out: io.StringIO) -> Context:
    ns = argparse.Namespace(config=None, debug=False, json=False, wide=False, command="status")
    return Context(args=ns, stdout=out, stderr=io.StringIO(), env={"XAF_HUB_PW_LAN_A": SECRET})


def test_a_table_cell_holding_a_secret_is_redacted_before_the_layout() -> None:
    out = io.StringIO()
    _ctx(out).table(
        [["lan-a", f"fix login {SECRET}"], ["lan-b", "Authorization: Basic Zm9vOmJhcg=="]],
        ["instance", "title"],
    )
    text = out.getvalue()
    assert SECRET not in text and "Zm9vOmJhcg" not in text
    lines = text.splitlines()
    assert lines[2].rstrip() == "lan-a       fix login ***"
    assert lines[3].rstrip() == "lan-b       Authorization: Basic ***"
    # The columns are as wide as the redacted cells, not the secret.
    assert len(lines[1]) == len("lan-a       Authorization: Basic ***")


def test_a_table_without_secrets_is_printed_as_is() -> None:
    out = io.StringIO()
    _ctx(out).table([["lan-a", "fix login", None]], ["instance", "title", "note"])
    assert out.getvalue().splitlines() == [
        "instance    title      note",
        "----------  ---------  ------",
        "lan-a       fix login",
    ]
