//! `lb`'s exit codes name the failure's kind (lb-user `error::ErrorKind`): scripts branch on
//! them, not on messages. No daemon, no namespace: an invalid configuration and a socket
//! nobody listens on.

use lb_tests::e2e::bin;
use lb_user::error::ErrorKind;
use std::process::Command;

fn code(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin("lb")).args(args).output().expect("running lb");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn an_invalid_configuration_exits_with_its_code() {
    let dir = std::env::temp_dir().join(format!("lb-exit-codes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"SCTP\"\n").unwrap();
    let (got, err) = code(&["validate", "--config", path.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(got, Some(ErrorKind::InvalidConfig.exit_code().into()), "{err}");
}

#[test]
fn no_daemon_on_the_socket_exits_with_its_code() {
    let socket = std::env::temp_dir().join(format!("lb-exit-codes-{}.sock", std::process::id()));
    let (got, err) = code(&["status", "--socket", socket.to_str().unwrap()]);
    assert_eq!(got, Some(ErrorKind::DaemonUnreachable.exit_code().into()), "{err}");
}
