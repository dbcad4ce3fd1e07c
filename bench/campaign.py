"""What every campaign file under bench/results/ starts with: the day and the commit."""
import datetime
import subprocess
from pathlib import Path


def stamp(repo: Path) -> tuple[str, str]:
    """(today as YYYY-MM-DD, the short commit measured)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                            text=True).stdout.strip()
    return datetime.date.today().isoformat(), commit
