"""Someone installs the project without its development tools (`pip install -e .[local,trainer]`)
and every module imports: what the code imports is declared, not borrowed from a development
dependency that happens to pull it in (psutil and packaging once came only with the SageMaker SDK).

- every package our code imports (outside `if TYPE_CHECKING:`, `importlib.import_module("...")`
  included) is a distribution that pyproject.toml declares where that code can count on it:
  `functions/` in the dependencies the Lambdas get, `trainer/` there or in the `trainer` extra,
  `retrain/` in those or the `cli` and `local` extras (`local` includes `cli`); every exception
  is listed below with its reason;
- every module of `functions/`, `retrain/` and `trainer/` imports, in a fresh interpreter.

`make test-trainer-image-torch` runs this file too, in an environment with the runtime and test
extras only (no dev tools) and the default training image's torch and Python.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement

from retrain.lambda_package import _runtime_imports, normalize

ROOT = Path(__file__).resolve().parents[2]
OURS = frozenset({"functions", "retrain", "trainer", "tests"})
# Which of pyproject's lists each folder's code may count on ("" = [project].dependencies).
MAY_USE = {"functions": ("",), "trainer": ("", "trainer"), "retrain": ("", "cli", "local", "trainer")}
# Imported, not declared, on purpose: (folder, module) -> why.
UNDECLARED: dict[tuple[str, str], str] = {
    ("functions", "botocore"): "comes with boto3, which pins it exactly (and the Lambda runtime has both)",
    ("retrain", "botocore"): "comes with boto3, which pins it exactly",
    ("functions", "yaml"): "only the `retrain` CLI reads a YAML job file through this code; Lambdas read JSON",
    ("trainer", "turbojpeg"): "an optional faster JPEG decoder, used when the image has it; Pillow otherwise",
}
# Handlers validate their settings when imported (cold start): without a function's environment
# they stop there, after their own imports. Their logic modules are imported one by one anyway.
HANDLER_SUFFIX = ".app"


def declared(extras: tuple[str, ...]) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lists = {"": project["dependencies"], **project["optional-dependencies"]}
    return {normalize(Requirement(text).name) for extra in extras for text in lists[extra]}


def _import_module_literals(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """`importlib.import_module("name")`: optional dependencies are imported this way."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value.split(".", 1)[0], node.lineno


def third_party_imports(folder: str) -> dict[str, str]:
    """Top-level module -> the first place our code in `folder` imports it."""
    found: dict[str, str] = {}
    for source in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(source.read_bytes(), filename=str(source))
        for module, line in [*_runtime_imports(tree), *_import_module_literals(tree)]:
            if module in sys.stdlib_module_names or module in OURS or module == "__future__":
                continue
            found.setdefault(module, f"{source.relative_to(ROOT)}:{line}")
    return found


def test_every_package_the_code_imports_is_declared_where_that_code_runs() -> None:
    distributions = importlib.metadata.packages_distributions()
    problems, excused = [], set()
    for folder, extras in MAY_USE.items():
        allowed = declared(extras)
        for module, where in sorted(third_party_imports(folder).items()):
            if (folder, module) in UNDECLARED:
                excused.add((folder, module))
                continue
            owners = {normalize(name) for name in distributions.get(module, [])}
            if not owners:
                problems.append(f"{where} imports {module}, which no installed distribution provides")
            elif not owners & allowed:
                lists = " or ".join(f"the {extra} extra" if extra else "[project].dependencies" for extra in extras)
                problems.append(f"{where} imports {module} ({', '.join(sorted(owners))}): declare it in {lists}")
    assert not problems, "imports that an install without dev extras may lack:\n" + "\n".join(problems)
    stale = sorted(set(UNDECLARED) - excused)
    assert not stale, f"listed as undeclared on purpose, but no longer imported: {stale}"


WALK = """
import importlib, json, pkgutil, sys
failed = {}
for package in ("functions", "retrain", "trainer"):
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, prefix=package + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as error:
            failed[info.name] = f"{type(error).__name__}: {error}"
        except Exception as error:
            if not info.name.endswith(sys.argv[1]):
                failed[info.name] = f"{type(error).__name__}: {error}"
print(json.dumps(failed))
"""


def test_every_module_imports_in_a_fresh_interpreter(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WALK, HANDLER_SUFFIX],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failed, "modules that do not import:\n" + "\n".join(f"{name}: {why}" for name, why in failed.items())
