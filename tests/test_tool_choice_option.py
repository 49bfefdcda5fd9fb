"""``serve --tool-choice``: the server-run voice sessions' default ``tool_choice`` for the ``--mcp`` tools
(app/host/config.py ``voice_tool_choice``), checked before anything starts; a Realtime session keeps its
client's own choice. The served behaviour: tests/e2e/test_phone_mcp_served.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from omniduplex.app.host.config import voice_tool_choice
from omniduplex.cli.main import cli

MCP = ["orders=http://127.0.0.1:9/mcp"]


def test_the_choices_map_to_the_session_forms():
    assert voice_tool_choice("auto", []) == "auto" and voice_tool_choice("none", []) == "none"
    assert voice_tool_choice("required", MCP) == "required"
    assert voice_tool_choice(" order_status ", MCP) == {"type": "function", "name": "order_status"}


@pytest.mark.parametrize("choice", ["required", "order_status"])
def test_a_forced_choice_needs_mcp_tools(choice):
    with pytest.raises(ValueError, match=f"--tool-choice {choice}: .* without --mcp"):
        voice_tool_choice(choice, [])
    with pytest.raises(ValueError, match="give auto, required, none"):
        voice_tool_choice("  ", MCP)


def test_serve_refuses_a_forced_choice_without_mcp_before_starting():
    res = CliRunner().invoke(cli, ["serve", "--tool-choice", "required"])
    assert res.exit_code == 2 and "without --mcp" in res.output, res.output
