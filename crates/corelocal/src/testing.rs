//! Helpers for tests that need privileges (used by this crate's and the other crates' tests).

/// Whether the process runs as root. When it does not, prints why the calling test skips and
/// returns `false` — except under `CI=true`, where privileged tests must not skip: it panics.
pub fn root_or_skip(test: &str) -> bool {
    if crate::sys::process::is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: needs root, and CI=true forbids skipping"
    );
    eprintln!("skipping {test}: needs root (CAP_BPF / CAP_NET_ADMIN)");
    false
}
