"""The house rules a newcomer relies on, checked on the source itself (issue 25):

- modules import downwards only: no two modules of ours import each other, directly or round a
  longer loop, whether the import is at the top of the module or inside a function;
- `functions/` holds what the Lambda packages import and nothing else: every module there is
  reached from some handler (`functions/<name>/app.py`) by imports;
- a function's folder imports no other function's folder: what two functions share lives in a
  shared folder (`common/`, `data/`, `validation/`), and only the composition root
  (`functions/wiring.py`) puts functions together;
- handlers are short and modules small enough to read: every `lambda_handler` at most 20 lines,
  no module in `trainer/` or `functions/` over 600 lines (none in `functions/` over 450), and the
  training run's `train()` (`trainer/train.py`) under 80 lines, split into helpers rather than
  excused: no `# noqa` for too many branches or statements (PLR0912, PLR0915) in that file.
- `retrain/local/` is grouped by what each part plays (`cloudformation/`, `lambda_runtime/`,
  `sagemaker/`, `fsx/`, `events/`, `endpoint/`): at most 3 modules lie loose beside its
  `__init__.py`, so a new module goes into the folder of what it does, or starts one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("functions", "retrain", "trainer")
HANDLER_MAX_LINES = 20
MODULE_MAX_LINES = 600  # trainer/ and functions/
FUNCTIONS_MODULE_MAX_LINES = 450
TRAIN_FUNCTION_MAX_LINES = 80  # `train()` in trainer/train.py
TRAIN = ROOT / "trainer" / "train.py"
LOCAL_LOOSE_MAX = 3
# Folders of functions/ that hold no handler and that every function may import: the common
# vocabulary, the data layer, and the pair checks the intake, the sweeper, the data layer and
# `retrain validate` share. Every other folder is one function's (it has an `app.py`).
SHARED_FOLDERS = frozenset({"common", "data", "validation"})
COMPOSITION_ROOT = "functions.wiring"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imported(name: str, path: Path) -> Iterator[str]:
    """The modules of ours that `name` imports, anywhere in its body (type-only imports too: a
    type that two modules need from each other belongs in a third)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a import b` imports a.b when b is a module, else something of a.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            module = target
            while module and module not in MODULES:
                module = module.rpartition(".")[0]
            if module and module != name:
                yield module


def _graph() -> dict[str, set[str]]:
    return {name: set(_imported(name, path)) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            # A package's __init__ importing its own submodules is not a loop between rooms.
            if node.startswith(nxt + "."):
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_modules_import_each_other() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (break each with a leaf module, or pass the values):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles
    )


def test_functions_holds_only_what_a_lambda_imports() -> None:
    graph = _graph()
    handlers = [name for name in MODULES if name.startswith("functions.") and name.endswith(".app")]
    reached: set[str] = set()
    todo = list(handlers)
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        todo.extend(graph[name])
        # Importing a.b.c runs a/__init__ and a/b/__init__ too.
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in MODULES)
    unreached = sorted(n for n in MODULES if n.startswith("functions") and n not in reached)
    assert not unreached, f"modules in functions/ that no Lambda imports (operator tools go to retrain/): {unreached}"


def _folder(module: str) -> str | None:
    """The folder of functions/ a module is in, or is (a package's __init__); None for the
    modules at the top of functions/ (functions/__init__, the composition root)."""
    parts = module.split(".")
    if parts[0] != "functions" or len(parts) < 2 or module == COMPOSITION_ROOT:
        return None
    return parts[1]


def _crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports of one function's folder from another's, or from a shared folder into a function's."""
    found = []
    for name, imported in sorted(graph.items()):
        if name == COMPOSITION_ROOT or not name.startswith("functions."):
            continue
        here = _folder(name)
        for target in sorted(imported):
            there = _folder(target)
            if there is not None and there != here and there not in SHARED_FOLDERS:
                found.append(f"{name} -> {target}")
    return found


def test_every_folder_of_functions_is_a_function_or_shared() -> None:
    folders = {path.parent.name for path in (ROOT / "functions").glob("*/__init__.py")}
    handlers = {path.parent.name for path in (ROOT / "functions").glob("*/app.py")}
    assert not SHARED_FOLDERS - folders, f"shared folders that are gone: {sorted(SHARED_FOLDERS - folders)}"
    assert not SHARED_FOLDERS & handlers, f"shared folders with a handler: {sorted(SHARED_FOLDERS & handlers)}"
    unsorted = sorted(folders - handlers - SHARED_FOLDERS)
    assert not unsorted, f"folders with no app.py that are not in SHARED_FOLDERS: {unsorted}"


def test_no_function_imports_another_functions_folder() -> None:
    crossings = _crossings(_graph())
    assert not crossings, (
        "a function's folder imports another's (move what both need to functions/common/, or put them "
        "together in functions/wiring.py):\n" + "\n".join(crossings)
    )


def test_the_crossing_finder_finds_a_crossing() -> None:
    # The check above must be able to fail; the composition root and the shared folders may be imported.
    graph = {
        "functions.evaluate_run.logic": {"functions.training_job.debugger", "functions.common.rules"},
        "functions.intake.app": {"functions.wiring", "functions.validation"},
        "functions.common.rules": {"functions.notify.render"},
        "functions.sweeper.logic": {"functions.notify"},
        "functions.wiring": {"functions.notify.logic"},
    }
    assert _crossings(graph) == [
        "functions.common.rules -> functions.notify.render",
        "functions.evaluate_run.logic -> functions.training_job.debugger",
        "functions.sweeper.logic -> functions.notify",
    ]


def test_every_handler_is_short() -> None:
    long = {}
    for name, path in MODULES.items():
        if not name.endswith(".app") or not name.startswith("functions."):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name == "lambda_handler":
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > HANDLER_MAX_LINES:
                    long[name] = lines
    assert not long, f"handlers over {HANDLER_MAX_LINES} lines: {long}"


def test_modules_are_small_enough_to_read() -> None:
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()}
    large = {
        name: size
        for name, size in sizes.items()
        if name.startswith(("trainer", "functions")) and size > MODULE_MAX_LINES
    }
    assert not large, f"trainer/ and functions/ modules over {MODULE_MAX_LINES} lines (split them): {large}"
    large = {
        name: size for name, size in sizes.items() if name.startswith("functions") and size > FUNCTIONS_MODULE_MAX_LINES
    }
    assert not large, f"functions/ modules over {FUNCTIONS_MODULE_MAX_LINES} lines: {large}"


def test_the_training_run_reads_top_to_bottom() -> None:
    source = TRAIN.read_text(encoding="utf-8")
    found = [node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == "train"]
    assert len(found) == 1, "trainer/train.py defines train() once, at module level"
    lines = (found[0].end_lineno or found[0].lineno) - found[0].lineno + 1
    assert lines < TRAIN_FUNCTION_MAX_LINES, (
        f"train() is {lines} lines: move its parts into helpers (set-up, the epoch, the finish)"
    )
    excused = [
        f"line {number}: {line.strip()}"
        for number, line in enumerate(source.splitlines(), 1)
        if "noqa" in line and ("PLR0912" in line or "PLR0915" in line)
    ]
    assert not excused, f"trainer/train.py excuses a long function instead of splitting it: {excused}"


def test_the_offline_stack_is_grouped_in_folders() -> None:
    """retrain/local/ keeps its modules in folders named for what they play, not loose beside them."""
    loose = sorted(p.name for p in (ROOT / "retrain" / "local").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= LOCAL_LOOSE_MAX, (
        f"retrain/local/ has {len(loose)} loose modules (at most {LOCAL_LOOSE_MAX}): {loose}; "
        "move them into the folder of what they do"
    )


def test_the_cycle_finder_finds_a_cycle() -> None:
    # The check above must be able to fail.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
