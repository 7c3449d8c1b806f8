//! A short soak in CI: `bench/soak.py` for two minutes against the debug binary — rpc, http
//! and kv servers under mixed load (keep-alive, one-shot, sessions, garbage, slow clients) with
//! a takeover every 15 s. Root only (the soak runs in its own network namespace); skipped with
//! a reason otherwise, never under CI=true. The recorded 10-minute run is
//! results/soak/soak-10min-moving-2.md; runs with a busy loop on each CPU beside it (as on a
//! shared CI machine), results/soak/soak-moving-runs.md.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_corelocal");
const DURATION_S: u32 = 120;
const PERIOD_S: u32 = 15;

#[test]
fn soak_with_takeovers_passes() {
    if !corelocal::testing::root_or_skip("soak_with_takeovers_passes") {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("corelocal-soak-{}", std::process::id()));
    let status = Command::new("python3")
        .arg(root.join("bench/soak.py"))
        .args(["--duration", &DURATION_S.to_string()])
        .args(["--period", &PERIOD_S.to_string()])
        .args(["--name", "soak", "--bin", BIN])
        .arg("--out")
        .arg(&out)
        .status()
        .expect("running python3 bench/soak.py");
    let report = std::fs::read_to_string(out.join("soak.md")).unwrap_or_default();
    println!("{report}");
    let json = std::fs::read_to_string(out.join("soak.json")).expect("soak.json written");
    let _ = std::fs::remove_dir_all(&out);
    assert!(status.success(), "soak failed:\n{report}");
    assert!(json.contains("\"pass\": true"), "{json}");
    let takeovers = json.matches("\"server\":").count();
    assert!(
        takeovers >= (DURATION_S / PERIOD_S - 1) as usize,
        "only {takeovers} takeovers"
    );
}
