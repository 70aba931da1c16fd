"""The docs stay true to the code: their command lines parse, their config comments name real settings.

Every command line in README.md and docs/*.md that names a ``dispatcher``
verb -- in a code span or a shell block, written ``dispatcher ...``,
``bin/dispatcher ...`` or ``python -m dispatcher.cli ...``, and every span of
the README's "Other commands" list -- must name verbs the parser has, and only
options those verbs take.  Placeholders (``W``, ``ID``, ``URL``), alternatives
(``status|set``) and optional parts (``[--json]``) are read as the docs mean
them.  Every ``section.key`` in the comments of config/*.yaml must be a
setting that dispatcher/config.py declares.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.cli.main import build_parser
from dispatcher.config import describe_settings

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PREFIX = re.compile(r"^(?:[A-Z_]+=\S+\s+)*"  # environment assignments
                    r"(?:(?:\./)?bin/dispatcher|python3? -m dispatcher\.cli|dispatcher)((?:\s+\S+)*)\s*$")
# Spans that read like a command and are not one, each with its reason.
NOT_COMMANDS = {
    "dispatcher notify ...",  # an application_name in pg_stat_activity (docs/operations.md)
    "dispatcher -c CONFIG <command>",  # the general form
    "dispatcher -c CONFIG ...",  # the general form
}
GLOBAL_WITH_VALUE = {"-c", "--config"}
GLOBAL_FLAGS = {"-v", "--verbose", "--help", "-h", "--version"}


def _spans(text: str) -> Iterator[str]:
    """Code spans of the prose, and each line of the shell blocks (comments cut)."""
    for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```", text, re.S):
        for line in block.splitlines():
            yield line.split(" #", 1)[0].strip()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    yield from (span.strip() for span in re.findall(r"`([^`\n]+)`", prose.replace("\n", " ")))


def _other_commands(readme: str) -> Iterator[str]:
    """The README's list of verbs, written without the program name."""
    paragraph = readme.split("Other commands:", 1)[1].split("\n\n", 1)[0]
    for span in re.findall(r"`([^`]+)`", paragraph.replace("\n", " ")):
        if re.match(r"[a-z]", span) and span.split()[0] in _verbs(build_parser()):
            yield span


def command_lines() -> list[tuple[str, str]]:
    """(file, the arguments after the program name) of every documented command line."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for span in _spans(text):
            if span in NOT_COMMANDS or "journalctl" in span or "systemctl" in span:
                continue
            match = PREFIX.search(span)
            if match and match.group(1).strip():
                found.append((path.name, match.group(1).strip()))
        if path.name == "README.md":
            found += [(path.name, span) for span in _other_commands(text)]
    return found


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subcommands here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _words(line: str) -> list[str]:
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    # Optional parts and groups are read as if given: [--json], (--a | --b).
    return [bare for word in words for bare in [word.strip("[]()")] if bare and bare != "|"]


def problems_of(line: str) -> list[str]:
    """Why ``line`` (the arguments after the program name) would not parse; empty when it would."""
    words = _words(line)
    parsers = [build_parser()]
    siblings = parsers  # an alternative may span options: "set --percent P|rank --log FILE"
    problems = []
    while words:
        word = words.pop(0)
        if word in GLOBAL_WITH_VALUE and len(parsers) == 1:
            words = words[1:]
            continue
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            for alternative in re.split(r"[|/]", name):
                if alternative.startswith("-") and not any(alternative in _options(p) for p in siblings) \
                        and alternative not in GLOBAL_FLAGS:
                    problems.append(f"no option {alternative} for {line!r}")
            continue
        verbs = {name: sub for p in parsers for name, sub in _verbs(p).items()}
        if not verbs:
            continue  # a value or a placeholder
        chosen = [verbs[w] for w in word.split("|") if w in verbs]
        unknown = [w for w in word.split("|") if re.fullmatch(r"[a-z][a-z0-9-]*", w) and w not in verbs]
        if not chosen or (unknown and len(parsers) == 1):
            problems.append(f"no command {word!r} in {line!r}")
            break
        parsers, siblings = chosen, list(verbs.values())
    return problems


def test_the_docs_name_commands() -> None:
    # The check below must see the command lines it is meant to keep true.
    lines = [line for _, line in command_lines()]
    assert len(lines) > 40
    assert any(line.startswith("token revoke") for line in lines)
    assert any(line.startswith("embedded status|stop|reset") for line in lines)


@pytest.mark.parametrize(("line", "problem"), [
    ("token revoke ID", None),
    ("-c CFG status [--json]", None),
    ("endpoint show|delete|close-breaker|rotate-secret ID", None),
    ("endpoint update ID [--url U] [--events a,b | --all-events]", None),
    ("rollout status|set --percent P|include W...", None),
    ("demo --events 5", "no command 'demo'"),
    ("token purge ID", "no command 'purge'"),
    ("status --yaml", "no option --yaml"),
    ("endpoint add --workspace W --colour red", "no option --colour"),
])
def test_the_check_reads_a_line_as_the_docs_mean_it(line: str, problem: str | None) -> None:
    found = problems_of(line)
    assert (found == []) if problem is None else (len(found) == 1 and problem in found[0]), found


def test_every_documented_command_line_parses() -> None:
    wrong = [f"{name}: {problem}" for name, line in command_lines() for problem in problems_of(line)]
    assert wrong == [], "\n".join(wrong)


# ---------------------------------------------------------------- config comments


def _settings() -> set[str]:
    return {name for name, _, _ in describe_settings()}


def _comment_keys(path: Path) -> Iterator[tuple[int, str]]:
    """``section.key`` names in the comments of ``path`` whose section is a settings section."""
    sections = {name.split(".", 1)[0] for name in _settings() if "." in name}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if "#" not in line:
            continue
        comment = line.split("#", 1)[1]
        for section, key in re.findall(r"\b([a-z_]+)\.([a-z_]+)\b", comment):
            if section in sections:
                yield number, f"{section}.{key}"


@pytest.mark.parametrize("path", sorted((REPO / "config").glob("*.yaml")), ids=lambda p: p.name)
def test_every_setting_a_config_comment_names_exists(path: Path) -> None:
    named = list(_comment_keys(path))
    missing = [f"{path.name}:{number}: {key}" for number, key in named if key not in _settings()]
    assert missing == [], f"config comments name settings dispatcher/config.py does not declare: {missing}"


def test_the_comment_check_sees_the_names() -> None:
    assert "http.timeout" in {key for _, key in _comment_keys(REPO / "config" / "local.yaml")}
