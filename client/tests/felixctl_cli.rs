//! `felixctl` as a user meets it before any broker is involved: `--help` explains every
//! command and usage errors exit with 2 and say what is wrong. (Its having an integration test
//! also makes `cargo test` build the binary, which the broker tests in gateway/ then run.)

use std::process::Command;

const FELIXCTL: &str = env!("CARGO_BIN_EXE_felixctl");

#[test]
fn help_lists_every_command() {
    let out = Command::new(FELIXCTL)
        .arg("--help")
        .output()
        .expect("run felixctl");
    assert!(out.status.success(), "--help exits 0");
    let text = String::from_utf8_lossy(&out.stdout);
    for command in [
        "tenant",
        "namespace",
        "stream",
        "publish",
        "subscribe",
        "segments",
    ] {
        assert!(
            text.contains(command),
            "--help mentions `{command}`:\n{text}"
        );
    }
}

#[test]
fn usage_errors_exit_2_and_name_the_problem() {
    let out = Command::new(FELIXCTL)
        .args(["segments", "not-a-stream-path"])
        .output()
        .expect("run felixctl");
    assert_eq!(
        out.status.code(),
        Some(2),
        "a malformed path is a usage error"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TENANT/NS/STREAM") || err.contains("not-a-stream-path"),
        "{err}"
    );
}
