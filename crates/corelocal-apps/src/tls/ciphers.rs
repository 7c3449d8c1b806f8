//! OpenSSL's cipher-list syntax (nginx's `ssl_ciphers`, memcached's `-o ssl_ciphers`, what
//! `SSL_CTX_set_cipher_list` takes), read for the TLS 1.2 suites offered here: rustls's six
//! ECDHE suites with AES-GCM or ChaCha20-Poly1305. As in OpenSSL, the list chooses TLS 1.2
//! suites only (TLS 1.3's are not affected) and in the order the client's preference is
//! matched against.
//!
//! The grammar is OpenSSL's (ciphers(1)): items separated by `:` (or `,`, `;`, space); an
//! item is a suite name or an alias, or several joined by `+` (the suites all of them match);
//! a prefix `!` removes for good, `-` removes (a later item may add back), `+` moves to the
//! end, none adds at the end what is not in yet; `@STRENGTH` sorts by key bits; other `@`
//! commands (`@SECLEVEL=n`) and words OpenSSL knows for suites not offered here (`AES128-SHA`,
//! `kRSA`, `MEDIUM`, `aNULL`) match nothing, as unknown words do in OpenSSL. A list that ends
//! up with no suite is refused, as OpenSSL refuses it — with the suites offered named.
//! The answers are OpenSSL 3's for those six suites (`openssl ciphers -s -tls1_2 LIST`; the
//! tests compare with it where it is installed).

use rustls::CipherSuite;

/// One TLS 1.2 suite offered here, with what OpenSSL's aliases match it by.
struct Suite {
    /// OpenSSL's name.
    name: &'static str,
    id: CipherSuite,
    ecdsa: bool,
    cipher: Cipher,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20,
}

impl Cipher {
    fn key_bits(self) -> u32 {
        match self {
            Cipher::Aes128Gcm => 128,
            Cipher::Aes256Gcm | Cipher::Chacha20 => 256,
        }
    }
}

/// In OpenSSL's own order (what an alias adds, in that order).
const SUITES: [Suite; 6] = [
    suite(
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        true,
        Cipher::Aes256Gcm,
    ),
    suite(
        "ECDHE-RSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        false,
        Cipher::Aes256Gcm,
    ),
    suite(
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        true,
        Cipher::Chacha20,
    ),
    suite(
        "ECDHE-RSA-CHACHA20-POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        false,
        Cipher::Chacha20,
    ),
    suite(
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        true,
        Cipher::Aes128Gcm,
    ),
    suite(
        "ECDHE-RSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        false,
        Cipher::Aes128Gcm,
    ),
];

const fn suite(name: &'static str, id: CipherSuite, ecdsa: bool, cipher: Cipher) -> Suite {
    Suite {
        name,
        id,
        ecdsa,
        cipher,
    }
}

/// Items in one list at most (OpenSSL has no limit; a list is a line of a config file).
const ITEMS_MAX: usize = 256;

/// Which of [`SUITES`] one word matches, as a bit set; `None`: a word that matches none of
/// them (unknown, or a suite or alias of OpenSSL's that none of them has).
fn word_matches(word: &str) -> Option<u8> {
    let all = |f: fn(&Suite) -> bool| {
        let mut set = 0u8;
        for (i, s) in SUITES.iter().enumerate() {
            if f(s) {
                set |= 1 << i;
            }
        }
        Some(set).filter(|&s| s != 0)
    };
    match word {
        "ALL" | "DEFAULT" | "HIGH" | "TLSv1.2" | "kECDHE" | "kEECDH" | "ECDHE" | "EECDH"
        | "ECDH" => all(|_| true),
        "aECDSA" | "ECDSA" => all(|s| s.ecdsa),
        "aRSA" => all(|s| !s.ecdsa),
        "AESGCM" | "AES" => all(|s| s.cipher != Cipher::Chacha20),
        "AES128" => all(|s| s.cipher == Cipher::Aes128Gcm),
        "AES256" => all(|s| s.cipher == Cipher::Aes256Gcm),
        "CHACHA20" => all(|s| s.cipher == Cipher::Chacha20),
        name => SUITES.iter().position(|s| s.name == name).map(|i| 1u8 << i),
    }
}

/// What an item does to the list.
#[derive(Clone, Copy)]
enum Op {
    Add,
    Remove,
    Kill,
    MoveToEnd,
}

/// The TLS 1.2 suites `list` (OpenSSL's syntax) chooses, in its order; an error naming the
/// suites offered here when it chooses none of them.
pub fn tls12_suites(list: &str) -> Result<Vec<CipherSuite>, String> {
    let mut chosen: Vec<usize> = Vec::new();
    let mut killed = 0u8;
    let items = list.split([':', ',', ';', ' ']).filter(|i| !i.is_empty());
    for (n, item) in items.enumerate() {
        if n == ITEMS_MAX {
            return Err(format!("more than {ITEMS_MAX} items in the cipher list"));
        }
        if item == "@STRENGTH" {
            // Stable: OpenSSL sorts by strength keeping the order within one strength.
            chosen.sort_by_key(|&i| std::cmp::Reverse(SUITES[i].cipher.key_bits()));
            continue;
        }
        if item.starts_with('@') {
            continue; // @SECLEVEL=n: the suites here are all above every level's floor.
        }
        let (op, words) = match item.as_bytes()[0] {
            b'!' => (Op::Kill, &item[1..]),
            b'-' => (Op::Remove, &item[1..]),
            b'+' => (Op::MoveToEnd, &item[1..]),
            _ => (Op::Add, item),
        };
        let mut set = 0b11_1111u8;
        for word in words.split('+') {
            set &= word_matches(word).unwrap_or(0);
        }
        apply(op, set, &mut chosen, &mut killed);
    }
    if chosen.is_empty() {
        let offered: Vec<&str> = SUITES.iter().map(|s| s.name).collect();
        return Err(format!(
            "no TLS 1.2 suite offered here is in the cipher list \"{list}\" (offered: {})",
            offered.join(":")
        ));
    }
    Ok(chosen.into_iter().map(|i| SUITES[i].id).collect())
}

fn apply(op: Op, set: u8, chosen: &mut Vec<usize>, killed: &mut u8) {
    let matches = |i: usize| set & (1 << i) != 0;
    match op {
        Op::Add => {
            for i in 0..SUITES.len() {
                if matches(i) && *killed & (1 << i) == 0 && !chosen.contains(&i) {
                    chosen.push(i);
                }
            }
        }
        Op::Remove => chosen.retain(|&i| !matches(i)),
        Op::Kill => {
            chosen.retain(|&i| !matches(i));
            *killed |= set;
        }
        Op::MoveToEnd => {
            let (moved, kept): (Vec<usize>, Vec<usize>) = chosen.iter().partition(|&&i| matches(i));
            *chosen = kept;
            chosen.extend(moved);
        }
    }
}

/// OpenSSL's name of a TLS 1.2 suite offered here (for messages and tests).
pub fn openssl_name(id: CipherSuite) -> Option<&'static str> {
    SUITES.iter().find(|s| s.id == id).map(|s| s.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Result<Vec<&'static str>, String> {
        tls12_suites(list).map(|v| v.into_iter().map(|id| openssl_name(id).unwrap()).collect())
    }

    /// Lists and OpenSSL 3.0's answer for them (`openssl ciphers -s -tls1_2 LIST`, kept to
    /// the six suites offered here; empty: OpenSSL picks other suites or none).
    const CASES: &[(&str, &str)] = &[
        ("HIGH:!aNULL:!MD5", "ECDHE-ECDSA-AES256-GCM-SHA384 ECDHE-RSA-AES256-GCM-SHA384 ECDHE-ECDSA-CHACHA20-POLY1305 ECDHE-RSA-CHACHA20-POLY1305 ECDHE-ECDSA-AES128-GCM-SHA256 ECDHE-RSA-AES128-GCM-SHA256"),
        ("ECDHE+AESGCM", "ECDHE-ECDSA-AES256-GCM-SHA384 ECDHE-RSA-AES256-GCM-SHA384 ECDHE-ECDSA-AES128-GCM-SHA256 ECDHE-RSA-AES128-GCM-SHA256"),
        ("kECDHE+aRSA", "ECDHE-RSA-AES256-GCM-SHA384 ECDHE-RSA-CHACHA20-POLY1305 ECDHE-RSA-AES128-GCM-SHA256"),
        ("ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256 ECDHE-ECDSA-AES128-GCM-SHA256"),
        ("AESGCM:-ECDSA:ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384 ECDHE-RSA-AES128-GCM-SHA256 ECDHE-ECDSA-AES128-GCM-SHA256"),
        ("AESGCM:!ECDSA:ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384 ECDHE-RSA-AES128-GCM-SHA256"),
        ("AES128:CHACHA20:+AES128", "ECDHE-ECDSA-CHACHA20-POLY1305 ECDHE-RSA-CHACHA20-POLY1305 ECDHE-ECDSA-AES128-GCM-SHA256 ECDHE-RSA-AES128-GCM-SHA256"),
        ("AES128:AES256:@STRENGTH", "ECDHE-ECDSA-AES256-GCM-SHA384 ECDHE-RSA-AES256-GCM-SHA384 ECDHE-ECDSA-AES128-GCM-SHA256 ECDHE-RSA-AES128-GCM-SHA256"),
        ("EECDH+AESGCM:EDH+AESGCM:@SECLEVEL=2", "ECDHE-ECDSA-AES256-GCM-SHA384 ECDHE-RSA-AES256-GCM-SHA384 ECDHE-ECDSA-AES128-GCM-SHA256 ECDHE-RSA-AES128-GCM-SHA256"),
        ("ECDHE-ECDSA-CHACHA20-POLY1305 AES128-SHA,ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305 ECDHE-RSA-AES256-GCM-SHA384"),
        ("DEFAULT:!CHACHA20:!ECDSA", "ECDHE-RSA-AES256-GCM-SHA384 ECDHE-RSA-AES128-GCM-SHA256"),
        ("AES128-SHA", ""),
        ("RSA", ""),
        ("SHA256:SHA384", ""),
        ("MEDIUM:LOW:aNULL", ""),
        ("nonsense", ""),
        ("ECDHE+nonsense", ""),
        ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", ""),
    ];

    #[test]
    fn lists_choose_what_openssl_chooses() {
        for (list, want) in CASES {
            let got = names(list).unwrap_or_default().join(" ");
            assert_eq!(&got, want, "{list}");
        }
    }

    #[test]
    fn a_list_that_chooses_none_is_refused_naming_the_suites_offered() {
        let err = tls12_suites("AES128-SHA:!ECDHE").unwrap_err();
        assert!(err.contains("AES128-SHA:!ECDHE"), "{err}");
        assert!(err.contains("ECDHE-RSA-AES128-GCM-SHA256"), "{err}");
        assert!(tls12_suites("").is_err());
        assert!(tls12_suites(&"HIGH:".repeat(300)).is_err());
    }

    /// The same lists against the `openssl` on this machine, where there is one.
    #[test]
    fn lists_agree_with_the_installed_openssl() {
        for (list, _) in CASES {
            let Ok(out) = std::process::Command::new("openssl")
                .args(["ciphers", "-s", "-tls1_2", list])
                .output()
            else {
                eprintln!("skipping: no openssl");
                return;
            };
            let text = String::from_utf8_lossy(&out.stdout);
            let theirs: Vec<&str> = text
                .trim()
                .split(':')
                .filter(|n| SUITES.iter().any(|s| s.name == *n))
                .collect();
            assert_eq!(names(list).unwrap_or_default(), theirs, "{list}");
        }
    }

    proptest::proptest! {
        /// Any text: no panic, no suite twice, nothing outside the six.
        #[test]
        fn any_list_gives_distinct_offered_suites(list in "[-+!@:,; A-Za-z0-9=.]{0,80}") {
            if let Ok(suites) = tls12_suites(&list) {
                let mut seen: Vec<Option<&str>> = suites.iter().map(|s| openssl_name(*s)).collect();
                proptest::prop_assert!(seen.iter().all(Option::is_some));
                seen.sort();
                seen.dedup();
                proptest::prop_assert_eq!(seen.len(), suites.len());
            }
        }
    }
}
