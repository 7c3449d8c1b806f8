//! HTTP dates (RFC 9110 §5.6.7): IMF-fixdate out; IMF-fixdate, RFC 850 and asctime in.
//! Also the Common Log Format timestamp for access logs. Time is unix seconds, UTC.

/// Length of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub const IMF_FIXDATE_LEN: usize = 29;

const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// Latest year accepted or produced (keeps arithmetic far from overflow).
const YEAR_MAX: i64 = 9999;

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    secs_of_day: u64,
}

/// Days since 1970-01-01 → (year, month, day); Howard Hinnant's `civil_from_days`.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) → days since 1970-01-01; Hinnant's `days_from_civil`.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil(unix: u64) -> Civil {
    let days = (unix / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    Civil {
        year,
        month,
        day,
        secs_of_day: unix % 86_400,
    }
}

fn put2(out: &mut [u8], v: u64) {
    out[0] = b'0' + (v / 10 % 10) as u8;
    out[1] = b'0' + (v % 10) as u8;
}

/// Formats unix seconds as an IMF-fixdate. Years past 9999 are clamped to 9999-12-31.
pub fn format_imf_fixdate(unix: u64) -> [u8; IMF_FIXDATE_LEN] {
    let max = (days_from_civil(YEAR_MAX, 12, 31) as u64) * 86_400 + 86_399;
    let unix = unix.min(max);
    let c = civil(unix);
    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    out[..3].copy_from_slice(DAYS[(unix / 86_400 % 7) as usize]);
    put2(&mut out[5..7], u64::from(c.day));
    out[8..11].copy_from_slice(MONTHS[c.month as usize - 1]);
    let y = c.year as u64;
    put2(&mut out[12..14], y / 100);
    put2(&mut out[14..16], y);
    put2(&mut out[17..19], c.secs_of_day / 3600);
    put2(&mut out[20..22], c.secs_of_day / 60 % 60);
    put2(&mut out[23..25], c.secs_of_day % 60);
    out
}

/// Formats unix seconds as a Common Log Format timestamp: `10/Oct/2000:13:55:36 +0000`.
pub fn format_clf(unix: u64) -> [u8; 26] {
    let imf = format_imf_fixdate(unix);
    let mut out = *b"01/Jan/1970:00:00:00 +0000";
    out[0..2].copy_from_slice(&imf[5..7]);
    out[3..6].copy_from_slice(&imf[8..11]);
    out[7..11].copy_from_slice(&imf[12..16]);
    out[12..20].copy_from_slice(&imf[17..25]);
    out
}

fn num(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 4 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
}

fn month(s: &[u8]) -> Option<u32> {
    MONTHS
        .iter()
        .position(|m| &m[..] == s)
        .map(|i| i as u32 + 1)
}

/// `HH:MM:SS` → seconds of day.
fn hms(s: &[u8]) -> Option<u64> {
    let [h1, h2, b':', m1, m2, b':', s1, s2] = s else {
        return None;
    };
    let (h, m, sec) = (num(&[*h1, *h2])?, num(&[*m1, *m2])?, num(&[*s1, *s2])?);
    // 60 is a leap second; treat it as 59 rather than refusing the date.
    (h < 24 && m < 60 && sec <= 60).then_some(h * 3600 + m * 60 + sec.min(59))
}

fn to_unix(year: u64, month: u32, day: u64, secs: u64) -> Option<u64> {
    if !(1970..=YEAR_MAX as u64).contains(&year) || !(1..=31).contains(&day) {
        return None;
    }
    let days = days_from_civil(year as i64, month, day as u32);
    // Reject days past the end of the month (they would roll over).
    if civil_from_days(days).2 != day as u32 {
        return None;
    }
    Some(days as u64 * 86_400 + secs)
}

/// Parses an HTTP date in any of the three formats; `None` if invalid or before 1970.
pub fn parse_http_date(s: &[u8]) -> Option<u64> {
    let fields: Vec<&[u8]> = s
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .take(7)
        .collect();
    match fields.as_slice() {
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        [_, day, mon, year, time, b"GMT"] if year.len() == 4 => {
            to_unix(num(year)?, month(mon)?, num(day)?, hms(time)?)
        }
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT (two-digit years: 70..99 → 19xx)
        [_, dmy, time, b"GMT"] => {
            let mut parts = dmy.split(|&b| b == b'-');
            let (Some(day), Some(mon), Some(yy), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return None;
            };
            let yy = num(yy).filter(|_| yy.len() == 2)?;
            let year = if yy >= 70 { 1900 + yy } else { 2000 + yy };
            to_unix(year, month(mon)?, num(day)?, hms(time)?)
        }
        // asctime: Sun Nov  6 08:49:37 1994
        [_, mon, day, time, year] => to_unix(num(year)?, month(mon)?, num(day)?, hms(time)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_dates() {
        assert_eq!(&format_imf_fixdate(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            &format_imf_fixdate(784_111_777),
            b"Sun, 06 Nov 1994 08:49:37 GMT"
        );
        assert_eq!(
            &format_imf_fixdate(951_782_400),
            b"Tue, 29 Feb 2000 00:00:00 GMT"
        );
        assert_eq!(&format_clf(971_186_136), b"10/Oct/2000:13:55:36 +0000");
    }

    #[test]
    fn parses_three_formats() {
        let t = Some(784_111_777);
        assert_eq!(parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), t);
        assert_eq!(parse_http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"), t);
        assert_eq!(parse_http_date(b"Sun Nov  6 08:49:37 1994"), t);
        assert_eq!(parse_http_date(b"Sun, 31 Feb 1994 08:49:37 GMT"), None);
        assert_eq!(parse_http_date(b"Sun, 06 Nov 1994 24:49:37 GMT"), None);
        assert_eq!(parse_http_date(b"garbage"), None);
        assert_eq!(parse_http_date(b""), None);
    }

    #[test]
    fn round_trips_every_day_for_centuries() {
        let mut t = 0u64;
        while t < 10_000_000_000 {
            let s = format_imf_fixdate(t);
            assert_eq!(
                parse_http_date(&s),
                Some(t),
                "{}",
                String::from_utf8_lossy(&s)
            );
            t += 86_400 * 7 + 3_601;
        }
    }

    #[test]
    fn clamps_far_future() {
        assert_eq!(&format_imf_fixdate(u64::MAX)[12..16], b"9999");
    }
}
