//! Byte sizes for flags: `65536`, `64KiB`, `1MiB`, `2GiB` (also `k`/`K`/`KB`, `M`, `G`, all
//! powers of 1024).

/// The largest size a flag accepts (1 TiB).
const SIZE_MAX: u64 = 1 << 40;

/// Parses `<integer>[unit]` with unit K/KiB/KB, M/MiB/MB or G/GiB/GB (powers of 1024, any
/// case); a bare number is bytes. At least 1 byte, at most 1 TiB.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a size like 65536, 64KiB or 1MiB"))?;
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (KiB, MiB, GiB)")),
    };
    match value.checked_mul(scale) {
        Some(n) if (1..=SIZE_MAX).contains(&n) => Ok(n),
        _ => Err(format!("{text:?}: out of range (1 B to 1 TiB)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes("64k"), Ok(64 << 10));
        assert_eq!(parse_bytes("1MiB"), Ok(1 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("1.5MiB").is_err());
        assert!(parse_bytes("5 parsecs").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("2048GiB").is_err());
    }
}
