"""Checks a built Lambda package (what the Makefile's `build-%` target puts in ARTIFACTS_DIR).

    python -m retrain.lambda_package ARTIFACTS_DIR

The package is built for the functions' platform (python3.13 on arm64), so it cannot be imported
here; this checks it without importing:

- every module the functions import (`functions/**/*.py`, outside `if TYPE_CHECKING:`) resolves
  to a top-level module of the package, to the standard library of Python 3.13, or to what the
  Lambda runtime provides (boto3 and its dependencies);
- every dependency of what pyproject.toml says the deployed functions need (its
  `[project].dependencies`, extras included) is in the package, or provided by the runtime;
- the package carries none of what the runtime provides (boto3, botocore: the runtime's own are
  used whatever the package holds) and nothing of the offline or training stack.

Prints the package's size and exits 1 with the problems found.
"""

from __future__ import annotations

import ast
import email.parser
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
LAMBDA_PYTHON = "3.13"
# The Lambda Python runtimes ship boto3, and with it what it depends on.
RUNTIME_DISTRIBUTIONS = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six", "urllib3"})
RUNTIME_MODULES = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "six", "urllib3"})
# Never in the package: the runtime's own boto3/botocore win anyway, and the rest is not for Lambda.
FORBIDDEN_MODULES = frozenset({"boto3", "botocore", "s3transfer", "torch", "sagemaker", "moto", "retrain", "trainer"})
# Imports that the package does not satisfy on purpose: inside a function, on a path Lambda never
# takes (the `retrain` CLI reads a YAML job configuration through the same code; on Lambda the
# configuration comes from the environment). Anything else unresolved fails the check.
NOT_ON_LAMBDA = {"functions/training_job/config.py": frozenset({"yaml"})}
# In this interpreter's standard library (3.11) but removed from 3.13's (PEP 594, lib2to3).
REMOVED_IN_313 = frozenset(
    {
        "aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis", "nntplib",
        "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib", "lib2to3",
    }
)  # fmt: skip
# How pip evaluates environment markers for Lambda's platform.
LAMBDA_MARKERS = {
    "python_version": LAMBDA_PYTHON,
    "python_full_version": f"{LAMBDA_PYTHON}.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "aarch64",
    "os_name": "posix",
}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def top_level_modules(package: Path) -> set[str]:
    """What `import NAME` finds at the package's root: packages (also namespace ones), modules
    and extension modules."""
    names = set()
    for path in package.iterdir():
        if path.is_dir() and not path.name.endswith((".dist-info", ".libs")) and path.name.isidentifier():
            names.add(path.name)
        elif path.suffix in {".py", ".so"}:
            names.add(path.name.split(".", 1)[0])
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(top-level module, line) of each absolute import, skipping `if TYPE_CHECKING:` blocks."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".", 1)[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".", 1)[0], node.lineno
        pending.extend(ast.iter_child_nodes(node))


def unresolved_imports(package: Path) -> list[str]:
    available = top_level_modules(package)
    stdlib = set(sys.stdlib_module_names) - REMOVED_IN_313
    problems = []
    for source in sorted((package / "functions").rglob("*.py")):
        tree = ast.parse(source.read_bytes(), filename=str(source))
        for module, line in _runtime_imports(tree):
            if module in NOT_ON_LAMBDA.get(source.relative_to(package).as_posix(), ()):
                continue
            if module not in available and module not in stdlib and module not in RUNTIME_MODULES:
                problems.append(f"{source.relative_to(package)}:{line}: imports {module}, which is not in the package")
    return problems


def installed_distributions(package: Path) -> dict[str, list[Requirement]]:
    """Each distribution in the package (normalized name) with its declared requirements."""
    found = {}
    for metadata_file in package.glob("*.dist-info/METADATA"):
        message = email.parser.Parser().parsestr(metadata_file.read_text(encoding="utf-8"), headersonly=True)
        found[normalize(message["Name"])] = [Requirement(text) for text in message.get_all("Requires-Dist") or []]
    return found


def deployed_requirements(pyproject: Path) -> list[Requirement]:
    """What the deployed functions need: pyproject.toml's `[project].dependencies`."""
    with pyproject.open("rb") as handle:
        return [Requirement(text) for text in tomllib.load(handle)["project"]["dependencies"]]


def missing_distributions(package: Path, roots: list[Requirement]) -> list[str]:
    """Requirements (followed through the package's own metadata) found neither in the package
    nor among the runtime's distributions."""
    installed = installed_distributions(package)
    problems, seen = [], set()
    pending = [(root, "pyproject.toml") for root in roots]
    while pending:
        requirement, wanted_by = pending.pop()
        name = normalize(requirement.name)
        extras = frozenset(requirement.extras)
        if (name, extras) in seen or name in RUNTIME_DISTRIBUTIONS:
            continue
        seen.add((name, extras))
        if name not in installed:
            problems.append(f"{requirement.name} (wanted by {wanted_by}) is not in the package")
            continue
        for child in installed[name]:
            environments = [{**LAMBDA_MARKERS, "extra": extra} for extra in (extras or {""})]
            if child.marker is None or any(child.marker.evaluate(env) for env in environments):
                pending.append((child, requirement.name))
    return problems


def forbidden_modules(package: Path) -> list[str]:
    return [f"{name} is in the package" for name in sorted(top_level_modules(package) & FORBIDDEN_MODULES)]


def package_bytes(package: Path) -> int:
    return sum(path.stat().st_size for path in package.rglob("*") if path.is_file())


def check(package: Path, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    return [
        *unresolved_imports(package),
        *missing_distributions(package, deployed_requirements(pyproject)),
        *forbidden_modules(package),
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    package = Path(args[0])
    if not (package / "functions").is_dir():
        print(f"{package}: no functions/ folder: not a built package", file=sys.stderr)
        return 2
    problems = check(package)
    for problem in problems:
        print(f"{package}: {problem}", file=sys.stderr)
    size = package_bytes(package) / MIB
    print(f"{package}: {size:.1f} MiB, {'FAILED' if problems else 'imports and dependencies resolve'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
