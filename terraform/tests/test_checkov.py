"""checkov over terraform/: no failed check except those skipped, with a reason, in
terraform/.checkov.yaml, and no skip that has become unnecessary.

checkov runs offline (--skip-download) from its own venv (scripts/test.sh creates it): it
pins old boto3/botocore and ships its own `hcl2` module, so it cannot share an environment
with python-hcl2. It exits 0 on parse errors, so parse errors are counted explicitly."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO, TERRAFORM

CONFIG = TERRAFORM / ".checkov.yaml"


@pytest.fixture(scope="module")
def checkov() -> str:
    candidates = [
        os.environ.get("FELIX_CHECKOV"),
        shutil.which("checkov"),
        str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "felix" / "checkov-venv" / "bin" / "checkov"),
    ]
    for path in candidates:
        if path and Path(path).is_file():
            return path
    pytest.fail("checkov not found: run scripts/test.sh (it installs checkov in its own venv) or set FELIX_CHECKOV")


def run(checkov, *args, cwd=REPO):
    result = subprocess.run(
        [checkov, *args, "-o", "json"], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert result.stdout.strip(), f"checkov printed nothing (exit {result.returncode}):\n{result.stderr}"
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    (report,) = [r for r in reports if r.get("check_type") == "terraform"]
    return report


def skipped_ids():
    return yaml.safe_load(CONFIG.read_text())["skip-check"]


def test_every_skip_has_a_reason():
    lines = CONFIG.read_text().splitlines()
    start = lines.index("skip-check:")
    reason = False
    for line in lines[start + 1 :]:
        if line.strip().startswith("#"):
            reason = len(line.strip()) > 40
        elif m := re.fullmatch(r"\s*- (CKV\w+)", line):
            assert reason, f"{m.group(1)} is skipped without a reason above it"
        elif line.strip():
            reason = False
    assert skipped_ids()


def test_checkov_finds_no_failed_check(checkov):
    report = run(checkov, "--config-file", str(CONFIG))
    summary = report["summary"]
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}:{c['file_line_range']}): {c['check_name']}"
        for c in report["results"]["failed_checks"]
    ]
    assert summary["parsing_errors"] == 0, "checkov could not parse some files"
    assert summary["failed"] == 0, "checkov failed checks:\n" + "\n".join(failed)
    assert summary["passed"] > 50 and summary["resource_count"] > 20, summary


def test_every_skipped_check_would_fail_without_the_skip(checkov, tmp_path):
    # checkov reads a .checkov.yaml in the scanned directory by itself, so scan a copy
    # of the configuration without it.
    for part in ("modules", "examples"):
        shutil.copytree(TERRAFORM / part, tmp_path / "terraform" / part)
    ids = skipped_ids()
    report = run(
        checkov, "-d", "terraform", "--framework", "terraform", "--skip-download", "--check", ",".join(ids), cwd=tmp_path
    )
    failing = {c["check_id"] for c in report["results"]["failed_checks"]}
    assert set(ids) <= failing, f"skips no longer needed (remove them): {sorted(set(ids) - failing)}"
