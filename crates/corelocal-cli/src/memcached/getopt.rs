//! memcached's command line split into options as its `getopt_long` call does: short options
//! alone or clustered (`-vv`, `-dM`, `-p11211`, `-p 11211`), long ones (`--port=11211`,
//! `--port 11211`, a unique prefix such as `--po`), `--` ending the options.

use super::Refusal;

/// Whether an option takes a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takes {
    Nothing,
    Value,
}

/// memcached 1.6.18's options (`shortopts` and `longopts` in memcached.c): the letter, the
/// long name ("" for `-D`, which has none) and whether a value follows.
const OPTIONS: &[(char, &str, Takes)] = &[
    ('a', "unix-mask", Takes::Value),
    ('A', "enable-shutdown", Takes::Nothing),
    ('Z', "enable-ssl", Takes::Nothing),
    ('p', "port", Takes::Value),
    ('s', "unix-socket", Takes::Value),
    ('U', "udp-port", Takes::Value),
    ('m', "memory-limit", Takes::Value),
    ('M', "disable-evictions", Takes::Nothing),
    ('c', "conn-limit", Takes::Value),
    ('k', "lock-memory", Takes::Nothing),
    ('h', "help", Takes::Nothing),
    ('i', "license", Takes::Nothing),
    ('V', "version", Takes::Nothing),
    ('r', "enable-coredumps", Takes::Nothing),
    // `--verbose` takes an optional `=LEVEL`, handled in `long`.
    ('v', "verbose", Takes::Nothing),
    ('d', "daemon", Takes::Nothing),
    ('l', "listen", Takes::Value),
    ('u', "user", Takes::Value),
    ('P', "pidfile", Takes::Value),
    ('f', "slab-growth-factor", Takes::Value),
    ('n', "slab-min-size", Takes::Value),
    ('L', "enable-largepages", Takes::Nothing),
    ('t', "threads", Takes::Value),
    ('D', "", Takes::Value),
    ('R', "max-reqs-per-event", Takes::Value),
    ('C', "disable-cas", Takes::Nothing),
    ('b', "listen-backlog", Takes::Value),
    ('B', "protocol", Takes::Value),
    ('I', "max-item-size", Takes::Value),
    ('S', "enable-sasl", Takes::Nothing),
    ('F', "disable-flush-all", Takes::Nothing),
    ('X', "disable-dumping", Takes::Nothing),
    ('W', "disable-watch", Takes::Nothing),
    ('Y', "auth-file", Takes::Value),
    ('e', "memory-file", Takes::Value),
    ('o', "extended", Takes::Value),
    ('N', "napi-ids", Takes::Value),
];

/// One option as getopt hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Given {
    /// The short letter (long options are mapped to theirs).
    pub(super) letter: char,
    /// Its value, for the options that take one (and `--verbose=N`).
    pub(super) value: Option<String>,
    /// How it was written, for messages: `-p`, `--port`.
    pub(super) spelled: String,
}

/// What the next argument is.
#[derive(Debug)]
pub(super) enum Token {
    /// An option (a cluster gives several, in order).
    Options(Vec<Result<Given, Refusal>>),
    /// A word that is no option (memcached ignores it).
    Operand(String),
    /// `--`: the arguments after it are `serve kv`'s.
    End,
}

/// Reads the argument at `*next` (and the value after it, when it takes one), moving `*next`
/// past what it read.
pub(super) fn token(args: &[String], next: &mut usize) -> Token {
    let arg = &args[*next];
    *next += 1;
    if arg == "--" {
        return Token::End;
    }
    if let Some(name) = arg.strip_prefix("--") {
        return Token::Options(vec![long(name, args, next)]);
    }
    match arg.strip_prefix('-') {
        Some(letters) if !letters.is_empty() => Token::Options(cluster(letters, args, next)),
        _ => Token::Operand(arg.clone()),
    }
}

/// getopt's message for what it did not understand; memcached then says `Illegal argument
/// "?"` and exits 1.
fn illegal(what: String) -> Refusal {
    Refusal::new(1, format!("{what}\nIllegal argument \"?\""))
}

fn long(text: &str, args: &[String], next: &mut usize) -> Result<Given, Refusal> {
    let (name, inline) = match text.split_once('=') {
        Some((n, v)) => (n, Some(v.to_string())),
        None => (text, None),
    };
    let exact = OPTIONS.iter().find(|(_, l, _)| !l.is_empty() && *l == name);
    let mut prefixed = OPTIONS
        .iter()
        .filter(|(_, l, _)| !l.is_empty() && l.starts_with(name));
    let found = match (exact, prefixed.next(), prefixed.next()) {
        (Some(o), _, _) => o,
        (None, Some(o), None) if !name.is_empty() => o,
        (None, Some(_), Some(_)) => return Err(illegal(format!("option '--{name}' is ambiguous"))),
        _ => return Err(illegal(format!("unrecognized option '--{text}'"))),
    };
    let (letter, long_name, takes) = *found;
    let spelled = format!("--{long_name}");
    let value = match (takes, inline) {
        (Takes::Nothing, Some(v)) if letter == 'v' => Some(v),
        (Takes::Nothing, Some(_)) => {
            return Err(illegal(format!(
                "option '{spelled}' doesn't allow an argument"
            )))
        }
        (Takes::Nothing, None) => None,
        (Takes::Value, Some(v)) => Some(v),
        (Takes::Value, None) => match args.get(*next) {
            Some(v) => {
                *next += 1;
                Some(v.clone())
            }
            None => return Err(illegal(format!("option '{spelled}' requires an argument"))),
        },
    };
    Ok(Given {
        letter,
        value,
        spelled,
    })
}

/// `-abc`: each letter an option until one that takes a value, which takes the rest of the
/// cluster or else the next argument.
fn cluster(letters: &str, args: &[String], next: &mut usize) -> Vec<Result<Given, Refusal>> {
    let mut out = Vec::new();
    for (at, letter) in letters.char_indices() {
        let spelled = format!("-{letter}");
        let Some(&(_, _, takes)) = OPTIONS.iter().find(|(s, _, _)| *s == letter) else {
            out.push(Err(illegal(format!("invalid option -- '{letter}'"))));
            continue;
        };
        if takes == Takes::Nothing {
            out.push(Ok(Given {
                letter,
                value: None,
                spelled,
            }));
            continue;
        }
        let rest = &letters[at + letter.len_utf8()..];
        let value = if !rest.is_empty() {
            Some(rest.to_string())
        } else if let Some(v) = args.get(*next) {
            *next += 1;
            Some(v.clone())
        } else {
            out.push(Err(illegal(format!(
                "option requires an argument -- '{letter}'"
            ))));
            break;
        };
        out.push(Ok(Given {
            letter,
            value,
            spelled,
        }));
        break;
    }
    out
}
