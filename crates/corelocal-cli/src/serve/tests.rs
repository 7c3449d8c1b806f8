//! Tests of the argument parsers.

use super::common::{parse_takeover, Takeover};

#[test]
fn takeover_takes_a_pid_or_a_path() {
    assert_eq!(parse_takeover("4242"), Ok(Takeover::Pid(4242)));
    for path in ["./4242", "/run/corelocal.sock", "up.sock", "-x"] {
        assert_eq!(parse_takeover(path), Ok(Takeover::Socket(path.into())));
    }
    for (bad, why) in [
        ("1", "not a server's process id"),
        ("0", "not a server's process id"),
        ("-5", "not a server's process id"),
        ("99999999999", "out of range"),
        ("", "expected a process id or a unix socket path"),
    ] {
        let e = parse_takeover(bad).unwrap_err();
        assert!(e.contains(why), "{bad:?}: {e}");
    }
}
