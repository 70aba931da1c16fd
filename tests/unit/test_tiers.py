"""Every test module lives in a tier folder: tox runs the tiers, and a module outside
them would never run."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e", "bench_smoke")


def test_every_test_module_is_in_a_tier() -> None:
    strays = [str(path.relative_to(TESTS)) for path in TESTS.rglob("test_*.py")
              if path.relative_to(TESTS).parts[0] not in TIERS]
    assert not strays, f"move these into one of tests/{{{','.join(TIERS)}}}: {strays}"
