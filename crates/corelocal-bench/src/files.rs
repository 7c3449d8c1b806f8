//! The paper's static file set (Affinity-Accept §6.2): 30,000 files of 30 B..5,670 B with a
//! mean near 700 B, seeded, plus the URL list the `http` workload reads.

use crate::workload::Rng;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Smallest file.
pub const MIN_SIZE: u64 = 30;
/// Largest file.
pub const MAX_SIZE: u64 = 5_670;

/// `files-gen` arguments.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct FilesArgs {
    /// Directory to write into (created; files go to DIR/f/NNNNN.html, the list to DIR/urls.txt).
    #[arg(long)]
    pub dir: PathBuf,
    /// Number of files.
    #[arg(long, default_value = "30000")]
    pub count: u64,
    /// Seed.
    #[arg(long, default_value = "1")]
    pub seed: u64,
}

/// File sizes: log-normal (median 420 B, σ 1.0) clamped to 30..5,670 B; mean ≈ 700 B.
pub fn sizes(count: u64, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| {
            // Box–Muller normal.
            let u1 = 1.0 - rng.unit();
            let u2 = rng.unit();
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            ((420.0f64.ln() + z).exp().round() as u64).clamp(MIN_SIZE, MAX_SIZE)
        })
        .collect()
}

/// The URL of file `i`.
pub fn url(i: u64) -> String {
    format!("/f/{i:05}.html")
}

/// Writes the file set and `urls.txt`.
pub fn run(a: FilesArgs) -> Result<ExitCode, String> {
    if a.count == 0 || a.count > 1_000_000 {
        return Err("--count must be within 1..1000000".into());
    }
    let fdir = a.dir.join("f");
    std::fs::create_dir_all(&fdir).map_err(|e| format!("{}: {e}", fdir.display()))?;
    let sizes = sizes(a.count, a.seed);
    let mut list = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let body: Vec<u8> = (0..n)
            .map(|k| {
                if k + 1 == n {
                    b'\n'
                } else {
                    b'a' + ((k + i as u64) % 26) as u8
                }
            })
            .collect();
        let p = fdir.join(format!("{i:05}.html"));
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))?;
        writeln!(list, "{}", url(i as u64)).map_err(|e| e.to_string())?;
    }
    let lp = a.dir.join("urls.txt");
    std::fs::write(&lp, list).map_err(|e| format!("{}: {e}", lp.display()))?;
    let mean = sizes.iter().sum::<u64>() as f64 / sizes.len() as f64;
    println!(
        "wrote {} files (mean {mean:.0} B) under {} and {}",
        a.count,
        fdir.display(),
        lp.display()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_file_set_shape() {
        let s = sizes(30_000, 1);
        assert_eq!(s.len(), 30_000);
        assert!(s.iter().all(|&n| (MIN_SIZE..=MAX_SIZE).contains(&n)));
        let mean = s.iter().sum::<u64>() as f64 / s.len() as f64;
        assert!((650.0..750.0).contains(&mean), "mean {mean}");
        assert_eq!(s, sizes(30_000, 1));
        assert_ne!(s, sizes(30_000, 2));
        assert_eq!(url(7), "/f/00007.html");
    }
}
