"""Shared helpers for the offline Terraform checks: where things are, and the parsed
configuration (python-hcl2) in a form the tests can walk.

These tests need no provider, no registry and no cloud account. They do need python-hcl2,
pytest and PyYAML (scripts/test.sh installs them), checkov for test_checkov.py, and the
`felix` binary for test_user_data.py (FELIX_BIN, else target/debug/felix, which
`cargo test` builds before scripts/test.sh runs these tests).
"""

from __future__ import annotations

import os
from pathlib import Path

import hcl2
import pytest

TESTS = Path(__file__).resolve().parent
TERRAFORM = TESTS.parent
REPO = TERRAFORM.parent
MODULE = TERRAFORM / "modules" / "felix-cluster"
EXAMPLE = TERRAFORM / "examples" / "three-az"
TEMPLATES = MODULE / "templates"


def tf_files() -> list[Path]:
    return sorted(p for p in TERRAFORM.rglob("*.tf") if ".terraform" not in p.parts)


def unquote(value):
    """python-hcl2 keeps the quotes of string literals ('"x"') and of block labels;
    expressions come as '${...}'. Strips the quotes of a literal, leaves the rest."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        return value[1:-1]
    return value


def load(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return hcl2.load(f)


class Config:
    """The merged top-level blocks of every .tf file in one module directory."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.docs = {p.name: load(p) for p in sorted(directory.glob("*.tf"))}

    def _entries(self, kind: str):
        for doc in self.docs.values():
            for entry in doc.get(kind, []):
                yield entry

    def labelled(self, kind: str, type_: str) -> dict[str, dict]:
        """`resource`/`data` blocks of one type, by name."""
        out = {}
        for entry in self._entries(kind):
            for t, named in entry.items():
                if unquote(t) != type_:
                    continue
                for name, body in named.items():
                    out[unquote(name)] = body
        return out

    def resources(self, type_: str) -> dict[str, dict]:
        return self.labelled("resource", type_)

    def data(self, type_: str) -> dict[str, dict]:
        return self.labelled("data", type_)

    def all_resource_types(self) -> set[str]:
        return {unquote(t) for entry in self._entries("resource") for t in entry}

    def variables(self) -> dict[str, dict]:
        return {unquote(n): b for entry in self._entries("variable") for n, b in entry.items()}

    def outputs(self) -> dict[str, dict]:
        return {unquote(n): b for entry in self._entries("output") for n, b in entry.items()}

    def locals(self) -> dict[str, str]:
        out = {}
        for entry in self._entries("locals"):
            out.update({k: v for k, v in entry.items() if k != "__is_block__"})
        return out

    def terraform_blocks(self) -> list[dict]:
        return list(self._entries("terraform"))


@pytest.fixture(scope="session")
def module() -> Config:
    return Config(MODULE)


@pytest.fixture(scope="session")
def example() -> Config:
    return Config(EXAMPLE)


@pytest.fixture(scope="session")
def felix_bin() -> Path:
    """The real broker binary whose --check-config judges the rendered configuration."""
    target = REPO / os.environ.get("CARGO_TARGET_DIR", "target")  # an absolute one wins
    path = Path(os.environ.get("FELIX_BIN") or target / "debug" / "felix")
    if not path.is_file():
        pytest.fail(
            f"felix binary not found at {path}: run `cargo build -p felix-gateway --bin felix` "
            "(scripts/test.sh runs cargo test first, which builds it) or set FELIX_BIN"
        )
    return path
