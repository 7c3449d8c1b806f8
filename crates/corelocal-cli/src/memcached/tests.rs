//! memcached's command line, option by option: the `serve kv` arguments each comes to, or
//! its refusal (message and exit status); and that every plan is one `serve kv` takes.

use super::{conf, parse, Env, Outcome, Plan, EX_OSERR, EX_USAGE};

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

fn plan(line: &str) -> Plan {
    plan_in(line, &Env::default())
}

fn plan_in(line: &str, env: &Env) -> Plan {
    match parse(&words(line), env) {
        Outcome::Serve(plan) => {
            // serve kv itself takes what it is given.
            let argv = ["corelocal", "serve", "kv"]
                .into_iter()
                .map(String::from)
                .chain(plan.args.iter().cloned());
            if let Err(e) = <crate::Cli as clap::Parser>::try_parse_from(argv) {
                panic!("{line:?}: serve kv refuses {:?}: {e}", plan.args);
            }
            plan
        }
        other => panic!("{line:?}: {other:?}"),
    }
}

/// Whether `args` holds `want` (a flag and its value, or a flag) as consecutive words.
fn holds(args: &[String], want: &str) -> bool {
    let want = words(want);
    args.windows(want.len()).any(|w| w == want.as_slice())
}

/// What memcached's defaults come to.
#[test]
fn no_options_are_memcacheds_defaults() {
    let p = plan("");
    assert_eq!(
        p.args,
        words(
            "--listen 0.0.0.0:11211 --max-conns 1024 --defer-accept 0 --stats-interval 0 \
             --drain-timeout 1s"
        )
    );
    assert!(p.notes.is_empty(), "{:?}", p.notes);
}

/// Each mapped option → the `serve kv` arguments it must give.
#[test]
fn each_mapped_option_gives_its_serve_kv_arguments() {
    let table: &[(&str, &[&str])] = &[
        ("-p 12345", &["--listen 0.0.0.0:12345"]),
        ("-p12345", &["--listen 0.0.0.0:12345"]),
        ("--port=12345", &["--listen 0.0.0.0:12345"]),
        ("--port 12345", &["--listen 0.0.0.0:12345"]),
        ("--po 12345", &["--listen 0.0.0.0:12345"]),
        ("-p -1", &["--listen 0.0.0.0:0"]),
        ("-p 0", &["--listen 0.0.0.0:0", "--no-tcp"]),
        ("-p 0 -U 5000", &["--no-tcp", "--udp-port 5000"]),
        // memcached 1.6: -U alone (not 0) puts TCP on the same port.
        ("-U 5000", &["--listen 0.0.0.0:5000", "--udp-port 5000"]),
        // As memcached: -U -1 alone puts TCP on a port the kernel picks too.
        ("-U -1", &["--listen 0.0.0.0:0", "--udp-port any"]),
        (
            "-p 11211 -U -1",
            &["--listen 0.0.0.0:11211", "--udp-port any"],
        ),
        ("-p 1 -U 2", &["--listen 0.0.0.0:1", "--udp-port 2"]),
        ("-l 127.0.0.1", &["--listen 127.0.0.1:11211"]),
        ("-l 127.0.0.1 -p 7", &["--listen 127.0.0.1:7"]),
        (
            "-l 127.0.0.1,::1",
            &["--listen 127.0.0.1:11211 --listen [::1]:11211"],
        ),
        (
            "-l 127.0.0.1 -l 127.0.0.2:99",
            &["--listen 127.0.0.1:11211 --listen 127.0.0.2:99"],
        ),
        ("-l [::1]:9000", &["--listen [::1]:9000"]),
        ("-l *", &["--listen 0.0.0.0:11211"]),
        ("-m 128", &["--memory-mb 128"]),
        ("--memory-limit=2048", &["--memory-mb 2048"]),
        ("-I 2m", &["--item-max 2097152"]),
        ("-I 4096", &["--item-max 4096"]),
        ("-I 512k", &["--item-max 524288"]),
        ("-c 10", &["--max-conns 10"]),
        ("-M", &["--disable-evictions"]),
        ("-A", &["--enable-shutdown"]),
        ("-F", &["--disable-flush-all"]),
        ("-C", &["--disable-cas"]),
        ("-X", &["--disable-dumping"]),
        ("-W", &["--disable-watch"]),
        (
            "-AMFC",
            &[
                "--disable-evictions",
                "--enable-shutdown",
                "--disable-flush-all",
                "--disable-cas",
            ],
        ),
        ("-Y /etc/auth", &["--auth-file /etc/auth"]),
        ("-D :", &["--detail-delimiter :"]),
        ("-D/x", &["--detail-delimiter /"]),
        ("-b 100", &["--backlog 100"]),
        ("-B auto", &["--protocol auto"]),
        ("-B ascii", &["--protocol ascii"]),
        ("-B binary", &["--protocol binary"]),
        ("-R 5", &["--reqs-per-event 5"]),
        ("-e /dev/shm/m", &["--memory-file /dev/shm/m"]),
        ("-d", &["--daemon"]),
        ("-d -P /run/m.pid", &["--pid-file /run/m.pid", "--daemon"]),
        ("-P /run/m.pid", &["--pid-file /run/m.pid"]),
        ("-o idle_timeout=5", &["--idle-timeout 5s"]),
        ("-o no_lru_crawler", &["--no-lru-crawler"]),
        ("-o no_modern", &["--no-lru-crawler"]),
        ("-o track_sizes", &["--track-sizes"]),
        ("-o watcher_logbuf_size=16", &["--watcher-buf-bytes 16384"]),
        (
            "-o idle_timeout=3,track_sizes,no_lru_crawler",
            &["--idle-timeout 3s", "--track-sizes", "--no-lru-crawler"],
        ),
        (
            "-p 1 -- --backend epoll --cpus 0",
            &["--listen 0.0.0.0:1", "--backend epoll --cpus 0"],
        ),
    ];
    for (line, wants) in table {
        let p = plan(line);
        for want in *wants {
            assert!(
                holds(&p.args, want),
                "{line:?}: no {want:?} in {:?}",
                p.args
            );
        }
    }
}

/// The last of a repeated option wins, as in memcached (except -l, which adds).
#[test]
fn a_later_option_replaces_an_earlier_one() {
    let p = plan("-m 10 -m 20 -p 1 -p 2 -P /a -P /b");
    assert!(holds(&p.args, "--memory-mb 20") && !holds(&p.args, "--memory-mb 10"));
    assert!(holds(&p.args, "--listen 0.0.0.0:2") && !holds(&p.args, "--listen 0.0.0.0:1"));
    assert!(holds(&p.args, "--pid-file /b") && !holds(&p.args, "--pid-file /a"));
    let p = plan("-o idle_timeout=5 -o idle_timeout=0");
    assert!(
        !p.args.iter().any(|a| a == "--idle-timeout"),
        "{:?}",
        p.args
    );
}

/// Options with no effect here: accepted, and said once each with the reason.
#[test]
fn harmless_options_are_accepted_and_said_once() {
    let table: &[(&str, &str)] = &[
        ("-t 4", "-t 4: no effect: one worker runs on each CPU"),
        ("-t 4 -t 8", "-t 4: no effect"),
        ("-u memcache", "-u memcache: no effect"),
        ("--user=memcache", "--user memcache: no effect"),
        ("-r", "-r: no effect"),
        ("-L", "-L: no effect"),
        ("-k", "-k: no effect: memory is not locked here"),
        ("-a 700", "-a 700: no effect"),
        ("-f 1.25", "-f 1.25: no effect"),
        ("-n 48", "-n 48: no effect"),
        ("-N 2", "-N 2: no effect"),
        ("-v", "-v: no per-request log here"),
        ("-vv", "-vv: no per-request log here"),
        ("-vvv", "-vvv: no per-request log here"),
        ("-v -v", "-vv: no per-request log here"),
        ("--verbose=2", "-vv: no per-request log here"),
        ("-o maxconns_fast", "-o maxconns_fast: no effect"),
        ("-o hashpower=16", "-o hashpower=16: no effect"),
        (
            "-o tail_repair_time=10",
            "-o tail_repair_time=10: no effect",
        ),
        (
            "-o lru_maintainer,lru_crawler",
            "-o lru_maintainer: no effect",
        ),
        ("-o slab_reassign", "-o slab_reassign: no effect"),
        ("-o slab_automove=1", "-o slab_automove=1: no effect"),
        (
            "-o hash_algorithm=xxh3",
            "-o hash_algorithm=xxh3: no effect",
        ),
        ("-o relaxed_privileges", "-o relaxed_privileges: no effect"),
        ("-o no_drop_privileges", "-o no_drop_privileges: no effect"),
        ("-o modern", "-o modern: no effect"),
        ("stray", "\"stray\" is not an option: ignored"),
    ];
    for (line, note) in table {
        let p = plan(line);
        assert_eq!(p.notes.len(), 1, "{line:?}: {:?}", p.notes);
        assert!(p.notes[0].starts_with(note), "{line:?}: {:?}", p.notes);
    }
}

/// Refusals: memcached's message (or ours, naming the option) and memcached's exit status.
#[test]
fn refusals_name_the_option_and_exit_as_memcached() {
    let table: &[(&str, u8, &str)] = &[
        ("-z", 1, "invalid option -- 'z'"),
        ("--fooble", 1, "unrecognized option '--fooble'"),
        ("--disable", 1, "option '--disable' is ambiguous"),
        ("-p", 1, "option requires an argument -- 'p'"),
        ("--port", 1, "option '--port' requires an argument"),
        (
            "--daemon=yes",
            1,
            "option '--daemon' doesn't allow an argument",
        ),
        ("-c 0", 1, "Maximum connections must be greater than 0"),
        ("-c x", 1, "Maximum connections must be greater than 0"),
        ("-t 0", 1, "Number of threads must be greater than 0"),
        (
            "-R 0",
            1,
            "Number of requests per event must be greater than 0",
        ),
        ("-f 1", 1, "Factor must be greater than 1"),
        ("-n 0", 1, "Chunk size must be greater than 0"),
        (
            "-N 0",
            1,
            "Maximum number of NAPI IDs must be greater than 0",
        ),
        (
            "-B soap",
            EX_USAGE,
            "Invalid value for binding protocol: soap",
        ),
        (
            "-I 1000",
            EX_USAGE,
            "Item max size cannot be less than 1024 bytes.",
        ),
        (
            "-I 1g",
            EX_USAGE,
            "-I 1g: an item size in bytes, or with k or m",
        ),
        (
            "-I 64m",
            EX_USAGE,
            "Cannot set item size limit higher than 1/2 of memory max.",
        ),
        (
            "-m 4096 -I 2048m",
            EX_USAGE,
            "Cannot set item size limit higher than a gigabyte.",
        ),
        (
            "-m 0",
            EX_USAGE,
            "Cannot set item size limit higher than 1/2 of memory max.",
        ),
        (
            "-Y /a -B binary",
            EX_USAGE,
            "You cannot allow the BINARY protocol",
        ),
        (
            "-Y /a -U 5",
            EX_USAGE,
            "Cannot use UDP with ascii authentication enabled",
        ),
        ("-p 70000", EX_USAGE, "-p 70000: not a port"),
        ("-U x", EX_USAGE, "-U x: not a port"),
        ("-b 0", EX_USAGE, "-b 0: the listen backlog is 1 or more"),
        ("-l [::1", 1, "Invalid IPV6 address: \"[::1\""),
        ("-l 127.0.0.1:x", 1, "Invalid port number: \"x\""),
        (
            "-s /tmp/m.sock",
            EX_USAGE,
            "-s: not supported by corelocal memcached",
        ),
        (
            "--unix-socket=/tmp/m",
            EX_USAGE,
            "--unix-socket: not supported",
        ),
        (
            "-S",
            EX_USAGE,
            "-S: not supported by corelocal memcached: This server is not built with SASL",
        ),
        (
            "-Z",
            EX_USAGE,
            "Error loading the certificate chain: (null)",
        ),
        (
            "-Z -o ssl_chain_cert=/dev/null",
            EX_USAGE,
            "Error loading the key: (null)",
        ),
        (
            "-Z -o ssl_chain_cert=/nonexistent/c.pem,ssl_key=/dev/null",
            EX_USAGE,
            "Error loading the certificate chain: /nonexistent/c.pem",
        ),
        (
            "-Z -p 0 -U 1 -o ssl_chain_cert=/dev/null,ssl_key=/dev/null",
            EX_USAGE,
            "You cannot enable SSL without a TCP port",
        ),
        (
            "-Z -o ssl_verify_mode=2,ssl_chain_cert=/dev/null,ssl_key=/dev/null",
            EX_USAGE,
            "-o ssl_verify_mode: not supported by corelocal memcached: client certificates \
             are checked against -o ssl_ca_cert=FILE",
        ),
        ("-o ssl_verify_mode=9", 1, "Invalid ssl_verify_mode"),
        ("-o ssl_min_version=4", 1, "Invalid ssl_min_version"),
        (
            "-Z -o ssl_ciphers=AES128-SHA:RC4,ssl_chain_cert=/dev/null,ssl_key=/dev/null",
            EX_USAGE,
            "Error setting the provided cipher(s): AES128-SHA:RC4",
        ),
        (
            "-o ssl_keyformat=2",
            EX_USAGE,
            "-o ssl_keyformat: not supported",
        ),
        ("-o ssl_fooble", 1, "Illegal suboption \"ssl_fooble\""),
        (
            "-Z -l notls:127.0.0.1 -o ssl_chain_cert=/dev/null,ssl_key=/dev/null",
            EX_USAGE,
            "every -l address notls:",
        ),
        (
            "-o ext_path=/mnt/x:1G",
            EX_USAGE,
            "-o ext_path: not supported",
        ),
        (
            "-o proxy_config=/c",
            EX_USAGE,
            "-o proxy_config: not supported",
        ),
        (
            "-o meta_response_old",
            EX_USAGE,
            "-o meta_response_old: not supported",
        ),
        ("-o fooble", 1, "Illegal suboption \"fooble\""),
        (
            "-o hashpower=4",
            1,
            "Initial hashtable multiplier of 4 is too low",
        ),
        ("-o hashpower", 1, "Missing numeric argument for hashpower"),
        (
            "-o idle_timeout=x",
            1,
            "Invalid numeric argument for idle_timeout",
        ),
        ("-o hash_algorithm=md5", 1, "Unknown hash_algorithm option"),
        (
            "-o watcher_logbuf_size=0",
            EX_USAGE,
            "-o watcher_logbuf_size=0: 1 to 65536",
        ),
        ("-D", 1, "option requires an argument -- 'D'"),
    ];
    for (line, code, message) in table {
        match parse(&words(line), &Env::default()) {
            Outcome::Refuse(r) => {
                assert_eq!(r.code, *code, "{line:?}: {r:?}");
                assert!(r.message.contains(message), "{line:?}: {r:?}");
            }
            other => panic!("{line:?}: not refused: {other:?}"),
        }
    }
}

/// -h, -V and -i print and exit 0, as soon as they are read (as memcached).
#[test]
fn help_version_and_license_print() {
    let print = |line: &str| match parse(&words(line), &Env::default()) {
        Outcome::Print(text) => text,
        other => panic!("{line:?}: {other:?}"),
    };
    assert!(print("-V").starts_with("memcached 1.6.18 (corelocal "));
    assert!(print("--version").starts_with("memcached 1.6.18"));
    assert!(print("-i").contains("MIT OR Apache-2.0"));
    let help = print("-h");
    assert!(help.starts_with("memcached 1.6.18"), "{help}");
    assert_eq!(print("-p 1 -h -z"), help);
    assert_eq!(print("-vh"), help);
    // memcached's test suite tests the features its help names: none refused here may be.
    for word in ["unix-socket", "sasl", "ext_path", "proxy_config"] {
        assert!(!help.to_lowercase().contains(word), "-h names {word}");
    }
}

/// As memcached-debug (memcached's debug build), `debugtime` is on; never otherwise.
#[test]
fn the_debug_build_has_debugtime() {
    let debug = Env {
        debug_build: true,
        ..Env::default()
    };
    assert!(plan_in("-p 1", &debug)
        .args
        .contains(&"--debug-time".into()));
    assert!(!plan("-p 1").args.contains(&"--debug-time".into()));
    let env = Env {
        port_file: Some("/tmp/ports".into()),
        ..Env::default()
    };
    assert!(holds(&plan_in("", &env).args, "--port-file /tmp/ports"));
}

#[test]
fn a_host_name_resolves_and_a_bad_one_is_refused() {
    let p = plan("-l localhost -p 9");
    assert!(holds(&p.args, "--listen 127.0.0.1:9"), "{:?}", p.args);
    match parse(&words("-l no-such-host.invalid"), &Env::default()) {
        Outcome::Refuse(r) => assert_eq!(r.code, EX_OSERR, "{r:?}"),
        other => panic!("{other:?}"),
    }
}

/// Debian's /etc/memcached.conf, read as its systemd-memcached-wrapper reads it.
#[test]
fn debians_memcached_conf_reads_as_its_wrapper_reads_it() {
    let text = "# memcached default config file\n\
                -d\n\
                logfile /var/log/memcached.log\n\
                # -v\n\
                -m 64   # megabytes\n\
                -p 11211\n\
                \t-u memcache  \n\
                -l 127.0.0.1\n\
                -P /var/run/memcached/memcached.pid\n\
                -D \\#\n\
                -h\n\
                \n";
    let (options, skipped) = conf::options(text);
    assert_eq!(
        options,
        words("-m 64 -p 11211 -u memcache -l 127.0.0.1 -P /var/run/memcached/memcached.pid -D #")
    );
    assert_eq!(skipped, vec!["logfile /var/log/memcached.log".to_string()]);
    let p = plan(&options.join(" "));
    for want in [
        "--listen 127.0.0.1:11211",
        "--memory-mb 64",
        "--pid-file /var/run/memcached/memcached.pid",
        "--detail-delimiter #",
    ] {
        assert!(holds(&p.args, want), "{want}: {:?}", p.args);
    }
    assert!(!p.args.contains(&"--daemon".to_string()));
}

#[test]
fn config_file_options_are_read_in_place() {
    let read = |path: &std::path::Path| match path.to_str() {
        Some("/etc/memcached.conf") => Ok("-m 64\n-p 11211\nlogfile /x\n".to_string()),
        _ => Err(std::io::ErrorKind::NotFound.into()),
    };
    let (args, said) = conf::expand(
        &words("-c 5 --config-file /etc/memcached.conf -p 1 -- --config-file x"),
        read,
    )
    .unwrap();
    assert_eq!(args, words("-c 5 -m 64 -p 11211 -p 1 -- --config-file x"));
    assert_eq!(said.len(), 1, "{said:?}");
    let (args, said) = conf::expand(&words("--config-file=/none -p 2"), read).unwrap();
    assert_eq!(args, words("-p 2"));
    assert!(said[0].contains("not found"), "{said:?}");
    let e = conf::expand(&words("--config-file"), read).unwrap_err();
    assert_eq!(e.code, EX_USAGE);
}

/// `-Z` with a chain and key: `serve kv --tls-*`, memcached's defaults (no resumption, TLS 1.2
/// and up), `notls:` listeners plain beside the TLS ones; ssl_* without -Z do nothing.
#[test]
fn tls_options_map_onto_serve_kv() {
    let files = "ssl_chain_cert=/dev/null,ssl_key=/dev/null";
    let p = plan(&format!("-Z -p 11211 -o {files}"));
    assert!(holds(&p.args, "--listen 0.0.0.0:11211"), "{:?}", p.args);
    assert!(holds(&p.args, "--tls-cert /dev/null --tls-key /dev/null"));
    assert!(holds(&p.args, "--tls-min-version 1.2"));
    assert!(holds(&p.args, "--tls-session-cache 0 --tls-no-tickets"));
    assert!(holds(&p.args, "--tls-ktls off"), "{:?}", p.args);
    assert!(!p.args.iter().any(|a| a == "--tls-listen"));
    let p = plan(&format!(
        "-Z -p 11211 -o {files},ssl_ciphers=ECDHE+AESGCM:!ECDSA"
    ));
    assert!(
        holds(&p.args, "--tls-ciphers ECDHE+AESGCM:!ECDSA"),
        "{:?}",
        p.args
    );
    let p = plan(&format!("-Z -p 11211 -o {files},ssl_kernel_tls"));
    assert!(holds(&p.args, "--tls-ktls auto"), "{:?}", p.args);
    assert!(p.notes.is_empty(), "{:?}", p.notes);
    let line = format!(
        "-Z -p 5 -l notls:127.0.0.1:7,127.0.0.1:8 -o {files},ssl_min_version=3 \
         -o ssl_session_cache,ssl_wbuf_size=4,ssl_kernel_tls,ssl_verify_mode=0,ssl_keyformat=1 \
         -o ssl_ca_cert=/dev/null"
    );
    let p = plan(&line);
    assert!(holds(&p.args, "--listen 127.0.0.1:7"), "{:?}", p.args);
    assert!(holds(&p.args, "--tls-listen 127.0.0.1:8"));
    assert!(holds(&p.args, "--tls-min-version 1.3"));
    assert!(holds(&p.args, "--tls-record-bytes 4096"));
    assert!(!p.args.iter().any(|a| a == "--tls-no-tickets"));
    assert!(!p.args.iter().any(|a| a == "--tls-client-ca"));
    let notes = p.notes.join("\n");
    assert!(holds(&p.args, "--tls-ktls auto"), "{:?}", p.args);
    assert!(
        notes.contains("ssl_kernel_tls: records stay in user space"),
        "{notes}"
    );
    assert!(
        notes.contains("ssl_ca_cert=/dev/null: no effect"),
        "{notes}"
    );
    for (mode, optional) in [("1", true), ("2", false), ("3", false)] {
        let p = plan(&format!(
            "-Z -o {files},ssl_verify_mode={mode},ssl_ca_cert=/dev/null"
        ));
        assert!(holds(&p.args, "--tls-client-ca /dev/null"), "{:?}", p.args);
        let has = p.args.iter().any(|a| a == "--tls-client-cert-optional");
        assert_eq!(has, optional, "mode {mode}: {:?}", p.args);
    }
    let p = plan("-o ssl_chain_cert=/x -l notls:127.0.0.1");
    assert!(
        !p.args.iter().any(|a| a.starts_with("--tls")),
        "{:?}",
        p.args
    );
    assert!(holds(&p.args, "--listen 127.0.0.1:11211"));
    assert!(p.notes.join("\n").contains("no effect without -Z"));
}
