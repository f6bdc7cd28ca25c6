"""The trainer as SageMaker receives it: reproducible, self-contained, runnable in AWS's image."""

from __future__ import annotations

import ast
import sys
import tarfile
from pathlib import Path

from retrain.package import TRAINER_DIR, build_sourcedir

# What AWS's PyTorch training images carry; anything else the trainer may only try to import.
IN_THE_IMAGE = {"torch", "numpy", "PIL"}
OPTIONAL = {"psutil", "pynvml", "simplejpeg", "turbojpeg", "cv2", "smdistributed"}


def test_the_same_sources_build_the_same_bytes(tmp_path: Path) -> None:
    first = build_sourcedir(tmp_path / "a")
    second = build_sourcedir(tmp_path / "b")

    assert first.sha256 == second.sha256
    assert (tmp_path / "a" / "sourcedir.tar.gz.sha256").read_text().startswith(first.sha256)


def test_train_py_is_at_the_root_and_nothing_but_sources_is_packed(tmp_path: Path) -> None:
    archive = build_sourcedir(tmp_path)

    with tarfile.open(archive.path) as packed:
        names = packed.getnames()
        owners = {(member.uid, member.gid, member.mtime) for member in packed.getmembers()}
    assert "train.py" in names and "profiling/rules.py" in names
    assert all(name.endswith(".py") and "__pycache__" not in name for name in names)
    assert owners == {(0, 0, 0)}, "no build machine's users or times in the archive"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported unguarded at module level) for every absolute import."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try | ast.FunctionDef | ast.AsyncFunctionDef | ast.If):
            guarded.update(id(inner) for inner in ast.walk(node) if inner is not node)
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [(name.split(".")[0], id(node) not in guarded) for name in names]
    return found


def test_the_trainer_needs_nothing_the_training_image_lacks() -> None:
    problems = []
    for path in sorted(TRAINER_DIR.rglob("*.py")):
        for module, unguarded in _imports(path):
            if module in sys.stdlib_module_names or module in {"trainer", "__future__"} | IN_THE_IMAGE:
                continue
            where = path.relative_to(TRAINER_DIR)
            if module not in OPTIONAL:
                problems.append(f"{where} imports {module}, which AWS's PyTorch image does not have")
            elif unguarded:
                problems.append(f"{where} imports the optional {module} without a fallback")
    assert problems == []
