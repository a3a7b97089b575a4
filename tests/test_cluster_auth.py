"""The documented way to start Ray leaves the cluster locked.

docs/operations.md's first block is run as written (the lines up to `ray start --head`, on ports
and a temp dir of the test's own) in a fresh home: the head starts with token authentication on,
the token file is readable by its owner alone, and a client without the token is refused. Without
the token file the same lines start nothing: token mode fails closed.
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, stop_head

pytestmark = pytest.mark.slow  # starts Ray

ROOT = Path(__file__).resolve().parent.parent


def documented_start() -> list[str]:
    """The command lines of docs/operations.md's section 1 block, up to and including `ray start --head`."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    block = doc.split("## 1. Start the cluster", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.startswith("ray start --head"))
    return lines[: start + 1]


def run_documented(home: Path, lines: list[str]) -> tuple[subprocess.CompletedProcess, str, int]:
    """Run `lines` in bash with HOME=`home`, `ray start` on ports of its own: (result, temp dir, dashboard port)."""
    temp_dir = tempfile.mkdtemp(prefix="ra", dir="/tmp")  # short: Ray's socket paths live under it
    dashboard = free_port()
    own = (
        f" --port={free_port()} --temp-dir={temp_dir} --num-cpus=1 --disable-usage-stats --dashboard-host=127.0.0.1"
        f" --dashboard-port={dashboard} --dashboard-agent-listen-port={free_port()} --metrics-export-port={free_port()}"
    )
    script = "set -e\n" + "\n".join(line + own if line.startswith("ray start --head") else line for line in lines)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=180, env=env)
    return done, temp_dir, dashboard


def status(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_documented_start_locks_the_cluster_and_fails_closed(tmp_path):
    lines = documented_start()
    assert any("RAY_AUTH_MODE=token" in line for line in lines) and lines[-1].startswith("ray start --head")
    home = tmp_path / "home"
    home.mkdir()
    done, temp_dir, dashboard = run_documented(home, lines)
    try:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        token_file = home / ".ray" / "auth_token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        url = f"http://127.0.0.1:{dashboard}"
        with urllib.request.urlopen(f"{url}/api/authentication_mode", timeout=30) as answer:
            assert json.load(answer) == {"authentication_mode": "token"}
        assert status(f"{url}/api/jobs/") == 401
        assert status(f"{url}/api/jobs/", {"Authorization": "Bearer not-the-token"}) == 403
        assert status(f"{url}/api/jobs/", {"Authorization": f"Bearer {token}"}) == 200
    finally:
        stop_head(temp_dir)

    bare = tmp_path / "bare"  # the same lines without the token's generation: nothing starts
    bare.mkdir()
    done, temp_dir, _ = run_documented(
        bare, [line for line in lines if "auth-token" not in line and "auth_token" not in line]
    )
    try:
        assert done.returncode != 0 and "token" in (done.stdout + done.stderr).lower()
    finally:
        stop_head(temp_dir)
