//! The paper's static workload (Affinity-Accept §6.2), generated deterministically.
//!
//! "The files served range from 30 bytes to 5,670 bytes. The web server serves 30,000 distinct
//! files, and a client chooses a file to request uniformly over all files." The paper gives
//! the range and, in §6.4, an average "around 700 bytes"; sizes here are `30·(5670/30)^(u^1.73)`
//! for a uniform `u` — a log-uniform skewed towards small files (SpecWeb-like: many small files,
//! a tail of larger ones) whose mean is ≈ 700 B (≈ 21 MB in all), with file 0 at exactly 30
//! bytes and file 1 at exactly 5,670. Same index → same path, size and bytes on every machine, so the built-in site,
//! a copy written to disk for nginx/lighttpd, and the load generator all agree.
//!
//! Paths: `/files/DD/NNNNN.txt` (DD = NNNNN / 1000, 30 directories of 1,000 files), plus
//! `/index.html` (also `/`), `/files.txt` (every file path, one per line — a ready URL list for
//! load generators) and `/64.txt` (a 64-byte file for the 1-request-per-connection test).

/// Number of files in the set.
pub const FILE_COUNT: usize = 30_000;
/// Smallest file, bytes.
pub const SIZE_MIN: usize = 30;
/// Largest file, bytes.
pub const SIZE_MAX: usize = 5_670;
/// Exponent skewing the log-uniform sizes towards small files so the mean is ≈ 700 B.
const SIZE_SKEW: f64 = 1.73;
/// Path of the 64-byte file.
pub const SMALL_PATH: &str = "/64.txt";
/// Path of the URL list.
pub const LIST_PATH: &str = "/files.txt";
/// Modification time reported for every generated file (2012-04-10, EuroSys 2012).
pub const MTIME_UNIX: u64 = 1_334_016_000;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The path of file `i` (`i < FILE_COUNT`).
pub fn path(i: usize) -> String {
    format!("/files/{:02}/{:05}.txt", i / 1000, i)
}

/// The size of file `i`, bytes.
pub fn size(i: usize) -> usize {
    match i {
        0 => SIZE_MIN,
        1 => SIZE_MAX,
        _ => {
            // u in [0, 1): 53 random bits.
            let u = (splitmix64(i as u64) >> 11) as f64 / (1u64 << 53) as f64;
            let ratio = SIZE_MAX as f64 / SIZE_MIN as f64;
            let s = (SIZE_MIN as f64 * ratio.powf(u.powf(SIZE_SKEW))).round() as usize;
            s.clamp(SIZE_MIN, SIZE_MAX)
        }
    }
}

/// The bytes of file `i`: a first line naming the file, then printable text, 64-column lines.
pub fn body(i: usize) -> Vec<u8> {
    body_with_seed(i as u64, size(i), &format!("file {i:05}\n"))
}

fn body_with_seed(seed: u64, len: usize, first_line: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .";
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&first_line.as_bytes()[..first_line.len().min(len)]);
    let mut state = splitmix64(seed ^ 0x5eed);
    while out.len() < len {
        if out.len() % 64 == 63 {
            out.push(b'\n');
            continue;
        }
        state = splitmix64(state);
        out.push(ALPHABET[(state & 63) as usize]);
    }
    out
}

/// The 64-byte file.
pub fn small_body() -> Vec<u8> {
    body_with_seed(u64::MAX, 64, "64 bytes\n")
}

/// Every file path, one per line.
pub fn list_body() -> Vec<u8> {
    let mut out = Vec::with_capacity(FILE_COUNT * 23);
    for i in 0..FILE_COUNT {
        out.extend_from_slice(path(i).as_bytes());
        out.push(b'\n');
    }
    out
}

/// The index page.
pub fn index_body() -> Vec<u8> {
    let total: usize = (0..FILE_COUNT).map(size).sum();
    let examples: String = [0, 1, 2, 12_345, FILE_COUNT - 1]
        .iter()
        .map(|&i| {
            format!(
                "<li><a href=\"{p}\">{p}</a> ({} bytes)</li>\n",
                size(i),
                p = path(i)
            )
        })
        .collect();
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>corelocal</title></head>\n\
         <body><h1>corelocal static file server</h1>\n\
         <p>This is the built-in site: the static workload of Affinity-Accept (EuroSys 2012, \
         &sect;6.2), {FILE_COUNT} files of {SIZE_MIN} to {SIZE_MAX} bytes ({total} bytes in all), \
         generated in memory. Serve your own files with <code>--root DIR</code>.</p>\n\
         <p>Every file path: <a href=\"{LIST_PATH}\">{LIST_PATH}</a>. \
         A 64-byte file: <a href=\"{SMALL_PATH}\">{SMALL_PATH}</a>.</p>\n<ul>\n{examples}</ul>\n\
         </body></html>\n"
    )
    .into_bytes()
}

/// Every file of the site as (path, bytes), the index page first (also served for `/`).
pub fn files() -> impl Iterator<Item = (String, Vec<u8>)> {
    let fixed = [
        ("/index.html".to_string(), index_body()),
        (LIST_PATH.to_string(), list_body()),
        (SMALL_PATH.to_string(), small_body()),
    ];
    fixed
        .into_iter()
        .chain((0..FILE_COUNT).map(|i| (path(i), body(i))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_span_the_papers_range() {
        let sizes: Vec<usize> = (0..FILE_COUNT).map(size).collect();
        assert_eq!(*sizes.iter().min().unwrap(), SIZE_MIN);
        assert_eq!(*sizes.iter().max().unwrap(), SIZE_MAX);
        let total: usize = sizes.iter().sum();
        let mean = total / FILE_COUNT;
        assert!((650..750).contains(&mean), "mean {mean}");
        // Skewed log-uniform: P(u^1.73 < 1/2) = 0.5^(1/1.73) ≈ 67% below the geometric
        // midpoint (~412 B).
        let below = sizes.iter().filter(|&&s| s < 412).count();
        assert!((19_000..21_200).contains(&below), "{below}");
    }

    #[test]
    fn bodies_are_deterministic_and_sized() {
        for i in [0, 1, 2, 999, 29_999] {
            let b = body(i);
            assert_eq!(b.len(), size(i));
            assert_eq!(b, body(i));
            assert!(b
                .iter()
                .all(|c| c.is_ascii_graphic() || *c == b' ' || *c == b'\n'));
        }
        assert_ne!(body(2)[12..], body(3)[12..]);
        assert_eq!(small_body().len(), 64);
        // Pin the generator: a change here changes every benchmark's workload.
        assert_eq!(size(2), 248);
        assert_eq!(&body(0)[..11], b"file 00000\n");
    }

    #[test]
    fn paths_are_unique_and_listed() {
        assert_eq!(path(12_345), "/files/12/12345.txt");
        let list = list_body();
        assert_eq!(list.iter().filter(|&&b| b == b'\n').count(), FILE_COUNT);
        let all: Vec<String> = files().map(|(p, _)| p).collect();
        let mut dedup = all.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(all.len(), dedup.len());
        assert_eq!(all.len(), FILE_COUNT + 3);
    }
}
