#!/usr/bin/env bash
# Felix's whole test suite, runnable on a fresh machine: installs what the tests need, then
# checks formatting and lints and runs every test. README.md and .ci/run call this script.
#
#   scripts/test.sh            install what is missing, then fmt + clippy + tests
#   FELIX_SKIP_INSTALL=1 ...   skip the install step (everything already present)
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

step() { printf '\n==> %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

if [ "${FELIX_SKIP_INSTALL:-0}" != 1 ]; then
  step "installing test dependencies"
  # The Rust toolchain comes with the machine. Rust components used below:
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
  # The suite needs nothing else yet: the log tests use real processes and real files only.
  # Later capabilities add their tools here (kcat, pyarrow, an S3-compatible server).
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked

step "all tests passed"
