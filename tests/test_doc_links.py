"""Every file of the checkout that README.md and docs/ name exists: a Markdown link's relative
target, or a path written out (`docs/report.md`, `jobs/stats/pooling.py`, configs/tiny.yaml), the
way these documents point to each other and to the code."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)
TOP = r"(?:docs|jobs|train|serve|common|bench|configs|tests|constraints|results|\.ci)"
# a path from the checkout's root
PATH = re.compile(rf"(?<![\w/.~-]){TOP}/[\w./@-]*\w\.(?:py|md|yaml|yml|json|txt|sh|toml)(?:\.gz)?(?!\.?\w)")


def named_files(path: Path) -> list[str]:
    """The checkout paths a document names: its links' relative targets (from its folder) and the
    paths it writes out (from the root), each as a path from the root."""
    text = path.read_text()
    links = [t.split("#")[0] for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]
    from_here = [
        str((path.parent / t).resolve().relative_to(ROOT))
        for t in links
        if (path.parent / t).resolve().is_relative_to(ROOT)
    ]
    return from_here + PATH.findall(text)


def test_every_file_the_docs_name_exists():
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {doc: named_files(doc) for doc in documents}
    missing = sorted(
        {
            f"{doc.relative_to(ROOT)}: {name}"
            for doc, names in named.items()
            for name in names
            if not (ROOT / name).exists()
        }
    )
    assert not missing, "named in the docs, not in the checkout:\n" + "\n".join(missing)
    assert sum(map(len, named.values())) > 100  # the check reads what the documents name
