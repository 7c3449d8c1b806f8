//! The live progress line on stderr.

use super::human;
use std::io::Write as _;

/// The progress line text.
pub fn progress_line(
    now: u64,
    warmup_end: u64,
    end: u64,
    units: u64,
    quota: Option<u64>,
    rate: f64,
) -> String {
    let width = 30usize;
    let frac = match quota {
        Some(q) if q > 0 => units as f64 / q as f64,
        _ => now as f64 / end.max(1) as f64,
    }
    .clamp(0.0, 1.0);
    let filled = (frac * width as f64).round() as usize;
    let phase = if now < warmup_end {
        "warm-up"
    } else {
        "measuring"
    };
    format!(
        "[{}{}] {:>5.1}s {phase:<9} {} units  {}/s",
        "#".repeat(filled),
        "-".repeat(width - filled),
        now as f64 / 1e9,
        units,
        human(rate)
    )
}

/// Redraws the progress line on stderr.
pub fn draw_progress(
    now: u64,
    warmup_end: u64,
    end: u64,
    units: u64,
    quota: Option<u64>,
    rate: f64,
) {
    let mut e = std::io::stderr().lock();
    let _ = write!(
        e,
        "\r{}\x1b[K",
        progress_line(now, warmup_end, end, units, quota, rate)
    );
    let _ = e.flush();
}

/// Clears the progress line.
pub fn clear_progress() {
    let mut e = std::io::stderr().lock();
    let _ = write!(e, "\r\x1b[K");
    let _ = e.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_and_human() {
        let l = progress_line(
            5_000_000_000,
            1_000_000_000,
            10_000_000_000,
            123,
            None,
            35_100.0,
        );
        assert!(
            l.contains("###############---------------")
                && l.contains("measuring")
                && l.contains("35.1k/s"),
            "{l}"
        );
        let l = progress_line(0, 1, 10, 50, Some(100), 0.0);
        assert!(l.contains("warm-up") && l.matches('#').count() == 15, "{l}");
        assert_eq!(human(1_500_000.0), "1.50M");
        assert_eq!(human(999.0), "999");
    }
}
