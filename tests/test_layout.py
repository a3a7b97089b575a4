"""The tree's promise, kept: imports run one way (pipeline -> phases -> runtime, reporting ->
experiment -> rundir, sources, stats, train, serve -> common), stats imports nothing of the project, the
library packages (common, train, serve) never import the experiment and common imports none of them (the
config plumbing, `Settings`, `ConfigError` and the YAML loader, lives there), jobs/phases/ holds phases alone, and a
built wheel carries every subpackage."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What each part of jobs/ may import from the project (besides itself). A part missing here may
# import anything: the entry scripts and the job log set-up.
ALLOWED = {
    "stats": set(),
    "rundir": {"common"},
    "sources": {"common", "serve", "train"},
    "experiment": {"sources", "stats", "rundir", "common", "train", "serve"},
    "sizing": {"experiment", "common", "train"},
    "runtime": {"experiment", "rundir", "common", "train", "serve"},
    "reporting": {"experiment", "stats", "common"},
    "phases": {"experiment", "rundir", "runtime", "reporting", "sources", "stats", "common", "train", "serve"},
}
NO_RAY = {"stats", "rundir", "sources", "experiment"}  # what a preset declares and the math: no cluster
LIBRARY = ("common", "train", "serve")
# What each library package may import from the project (besides itself): common is the floor.
LIBRARY_ALLOWED = {"common": set(), "train": {"common"}, "serve": {"common"}}


def imported(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def part(module: str) -> str | None:
    """`jobs.stats.evidence` -> "stats"; `train.trainer` -> "train"; a third-party module -> None."""
    pieces = module.split(".")
    if pieces[0] == "jobs":
        return pieces[1] if len(pieces) > 1 else "jobs"
    return pieces[0] if pieces[0] in LIBRARY else None


def test_imports_run_one_way():
    wrong = []
    for name, allowed in ALLOWED.items():
        for path in sorted((ROOT / "jobs" / name).rglob("*.py")):
            for module in imported(path):
                target = part(module)
                if target is not None and target != name and target not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {module}")
                if name in NO_RAY and module.split(".")[0] == "ray":
                    wrong.append(f"{path.relative_to(ROOT)} imports {module} (no Ray in jobs/{name})")
    assert not wrong, "imports against the layout (docs/contributing.md):\n" + "\n".join(wrong)


def test_the_library_never_imports_the_experiment():
    """A library module, and a library's command line (`python -m train`), imports without the experiment."""
    wrong = [
        f"{path.relative_to(ROOT)} imports {module}"
        for lib in LIBRARY
        for path in sorted((ROOT / lib).rglob("*.py"))
        for module in imported(path)
        if module.split(".")[0] == "jobs"
    ]
    assert not wrong, "\n".join(wrong)


def test_the_library_imports_one_way():
    """train and serve import only common of the project; common imports none of it, so the config
    plumbing (common/config.py) that train/ and jobs/ both build on sits below both."""
    wrong = [
        f"{path.relative_to(ROOT)} imports {module}"
        for lib, allowed in LIBRARY_ALLOWED.items()
        for path in sorted((ROOT / lib).rglob("*.py"))
        for module in imported(path)
        if module.split(".")[0] in LIBRARY and module.split(".")[0] not in {lib, *allowed}
    ]
    assert not wrong, "imports against the layout (docs/contributing.md):\n" + "\n".join(wrong)


def test_jobs_phases_holds_phases_alone():
    """Each module of jobs/phases/ is a phase PHASES runs; what phases share lives in runtime/ and reporting/."""
    from jobs.phases import PHASES

    modules = {p.stem for p in (ROOT / "jobs" / "phases").glob("*.py")} - {"__init__"}
    assert modules == set(PHASES)


def test_the_walk_sees_a_wrong_import(tmp_path):
    """The check can fail: a stats module reaching into Serve, even inside a function, is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from serve.engine import Engine\n    import jobs.phases.report\n")
    assert {part(m) for m in imported(bad)} == {"serve", "phases"}


def test_a_built_wheel_carries_every_module_of_jobs(tmp_path):
    """pyproject finds packages by discovery: a wheel built from the tree holds every module of the
    four packages, subpackages included (a package list would silently leave new folders out)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"  # a copy: setuptools leaves build/ and egg-info beside the sources it builds
    for name in (*LIBRARY, "jobs"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    carried = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for lib in ("jobs", *LIBRARY) for p in (ROOT / lib).rglob("*.py")}
    assert modules - carried == set()


def project_imports() -> dict[str, set[str]]:
    """{module: the project modules it imports, at the top or inside a function} over jobs, train,
    serve and common; `from a.b import c` counts a.b.c where c is a module, else a.b."""
    files = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for top in ("jobs", *LIBRARY)
        for p in (ROOT / top).rglob("*.py")
    }
    files = {name.removesuffix(".__init__"): p for name, p in files.items()}
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name in files}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in files:
                targets |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module for a in node.names
                }
        graph[name] = targets - {name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's circles: its strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_module_imports_itself_round_a_circle():
    """A circle, even through an import inside a function, means neither module can be read (or
    moved) without the other."""
    circles = import_circles(project_imports())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def test_modules_and_functions_stay_small():
    """Every module of the project under 400 lines; every function of train/ and jobs/ under 80
    (a long one is read as steps with names: docs/contributing.md)."""
    long_modules, long_functions = [], []
    for top in ("jobs", *LIBRARY):
        for path in sorted((ROOT / top).rglob("*.py")):
            text = path.read_text()
            if len(text.splitlines()) > 400:
                long_modules.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
            if top in ("jobs", "train"):
                for node in ast.walk(ast.parse(text, str(path))):
                    if (
                        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and node.end_lineno - node.lineno + 1 > 80
                    ):
                        long_functions.append(
                            f"{path.relative_to(ROOT)}: {node.name}, {node.end_lineno - node.lineno + 1} lines"
                        )
    assert not long_modules and not long_functions, "\n".join(long_modules + long_functions)


def test_lines_are_kept_short_by_splitting_not_by_formatter_exemptions():
    """The formatter's line length stays at 120 or under and no line is exempted from it (by the
    formatter's skip or off comments): a rule kept by packing a line past the formatter is no rule."""
    import tomllib

    length = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]
    assert length <= 120, f"pyproject.toml: ruff line-length {length}"
    markers = ("# fmt: " + "skip", "# fmt: " + "off")  # split, so this file does not hold them itself
    exempted = [
        f"{path.relative_to(ROOT)}:{number}"
        for top in ("jobs", "bench", "tests", *LIBRARY)
        for path in sorted((ROOT / top).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(marker in line for marker in markers)
    ]
    assert not exempted, "formatter exemptions: " + ", ".join(exempted)
