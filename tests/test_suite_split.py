"""tests/suite.sh's split, kept whole: its alone stage runs the `quiet` tests from the files it names
(collecting only those), so a file that marks a test `quiet` and is not named would run nowhere."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quiet_files_named(script: str) -> set[str]:
    return set(re.search(r'^quiet_files="([^"]*)"', script, re.M).group(1).split())


def files_marking_quiet(tests: Path) -> set[str]:
    """Test files that mark tests quiet (a module's pytestmark, a test's decorator or a param's marks)."""
    return {
        path.relative_to(tests.parent).as_posix()
        for path in tests.rglob("test_*.py")
        if re.search(r"\bmark\.quiet\b", path.read_text())
    }


def test_the_suites_quiet_stage_names_every_file_that_marks_a_test_quiet(tmp_path):
    named = quiet_files_named((ROOT / "tests" / "suite.sh").read_text())
    assert named and named == files_marking_quiet(ROOT / "tests")
    assert all((ROOT / name).is_file() for name in named)
    # the check can fail: a new file marking a test quiet is found
    mark = "@pytest.mark." + "quiet"  # split, so this file does not mark anything itself
    (tmp_path / "tests" / "serve").mkdir(parents=True)
    (tmp_path / "tests" / "serve" / "test_new.py").write_text(f"{mark}\ndef test_x(): ...\n")
    assert files_marking_quiet(tmp_path / "tests") == {"tests/serve/test_new.py"}
