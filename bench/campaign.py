"""What every campaign file under bench/results/ starts with (the day, the commit,
the command that made it) and how it is written."""
import datetime
import subprocess
from pathlib import Path


def stamp(repo: Path) -> tuple[str, str]:
    """(today as YYYY-MM-DD, the short commit measured)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                            text=True).stdout.strip()
    return datetime.date.today().isoformat(), commit


def write(repo: Path, slug: str, title: str, command: str, body: list) -> Path:
    """bench/results/<date>-<slug>.md: a title with the day and commit, the command
    (run on the 2-core VM with nothing else running), then `body`; printed too."""
    date, commit = stamp(repo)
    text = [f"# {title} ({date}, at {commit})", "",
            f"`{command}` on the 2-core VM, nothing else running (what and how: the script's docstring).",
            "", *body]
    path = repo / "bench" / "results" / f"{date}-{slug}.md"
    path.write_text("\n".join(text) + "\n")
    print("\n".join(text))
    print(f"wrote {path.relative_to(repo)}")
    return path
