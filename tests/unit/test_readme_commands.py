"""CI runs the README's test command, verbatim: what a new user types is what CI proves."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _quick_start_commands() -> list[str]:
    """The shell blocks of the README's first section, one command line each."""
    section = (REPO / "README.md").read_text().split("\n## ")[1]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_the_quick_start_has_two_one_line_commands() -> None:
    commands = _quick_start_commands()
    assert len(commands) == 2 and all("\n" not in command for command in commands), commands


def test_ci_runs_the_readmes_test_command_and_nothing_else() -> None:
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith(("#", "export ", "set ", "cd "))]
    assert commands == [_quick_start_commands()[1]]
