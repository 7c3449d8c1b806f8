//! What `-h`, `-V` and `-i` print (standard output, exit 0, as memcached).

/// The memcached release whose command line and protocol this follows.
pub const MEMCACHED_VERSION: &str = "1.6.18";

/// `-V`: memcached's version line, then what answers.
pub fn version() -> String {
    format!(
        "memcached {MEMCACHED_VERSION} (corelocal {} serve kv)\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// `-i`.
pub fn license() -> String {
    format!(
        "corelocal {}: MIT OR Apache-2.0. `corelocal memcached` reads memcached {MEMCACHED_VERSION}'s \
         command line (memcached: BSD license) and serves with corelocal's own code.\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// `-h`: memcached 1.6.18's usage, each option as it works here.
///
/// memcached's test suite reads this text to decide which features to test: it must not name
/// the ones refused here by the words the suite looks for (its unix-domain socket, SASL,
/// external storage and proxy options). TLS is named: `-Z` is served.
pub fn usage() -> String {
    format!(
        "memcached {MEMCACHED_VERSION} (corelocal {version}: `corelocal serve kv` with memcached's options)
-p, --port=<num>          TCP port to listen on (default: 11211; 0: none; -1: any)
-U, --udp-port=<num>      UDP port to listen on (default: 0, off)
-A, --enable-shutdown     enable ascii \"shutdown\" command
-l, --listen=<addr>       interface to listen on (default: INADDR_ANY, all IPv4
                          interfaces); ADDR, ADDR:PORT, [IPV6]:PORT, comma-separated
                          or repeated; with -Z, notls:<addr> for a plain listener
-Z, --enable-ssl          enable TLS/SSL (rustls, TLS 1.2 and 1.3; needs ssl_chain_cert
                          and ssl_key)
-d, --daemon              run as a daemon (exits once the server serves)
-m, --memory-limit=<num>  item memory in megabytes (default: 64)
-M, --disable-evictions   return error on memory exhausted instead of evicting
-c, --conn-limit=<num>    max simultaneous connections (default: 1024)
-v, --verbose             accepted; no per-request log (use `watch`)
-vv, -vvv                 the same
-h, --help                print this help and exit
-i, --license             print the license and exit
-V, --version             print version and exit
-P, --pidfile=<file>      save PID in <file> once serving (removed at a clean stop)
-D <char>                 Use <char> as the delimiter between key prefixes and IDs
                          (per-prefix stats, turned on by this option)
-R, --max-reqs-per-event  maximum number of requests per event (default: 20)
-C, --disable-cas         disable use of CAS
-b, --listen-backlog=<num> set the backlog queue limit (default here: 4096)
-B, --protocol=<name>     protocol - one of ascii, binary, or auto (default: ascii;
                          no binary protocol is spoken: binary requests are closed)
-I, --max-item-size=<num> adjusts max item size (default: 1m, min: 1k, max: 1024m)
-F, --disable-flush-all   disable flush_all command
-X, --disable-dumping     disable stats cachedump and lru_crawler metadump
-W  --disable-watch       disable watch commands (live logging)
-Y, --auth-file=<file>    enable ASCII protocol authentication. format:
                          user:pass\\nuser2:pass2\\n
-e, --memory-file=<file>  restartable cache: saved to <file> at a graceful stop
                          (SIGUSR1 or `shutdown graceful`), loaded at start
-o, --extended            comma separated list of extended options:
   - idle_timeout:        timeout for idle connections. (default: 0, no timeout)
   - no_lru_crawler:      no background reclaim of expired items (no_modern too)
   - lru_crawler:         background reclaim of expired items (the default)
   - track_sizes:         enable dynamic reports for 'stats sizes' command.
   - watcher_logbuf_size: size in kilobytes of per-watcher write buffer. (default: 256)
   - ssl_chain_cert:      certificate chain file in PEM format
   - ssl_key:             private key in PEM format (PKCS#8, RSA or EC)
   - ssl_min_version:     2 (tlsv1.2, the default; 0 and 1 mean it too) or 3 (tlsv1.3)
   - ssl_session_cache:   resume TLS sessions (per-worker cache and tickets)
   - ssl_wbuf_size:       kilobytes per TLS record at most (records stop at 16)
   - ssl_verify_mode:     0 none (default), 1 ask for a client certificate, 2 and 3
                          require one (checked against ssl_ca_cert)
   - ssl_ca_cert:         PEM format file of acceptable client CA's
   - ssl_kernel_tls:      the kernel makes the TLS 1.3 records it sends where it has
                          the tls module (printed at start); off by default
   - ssl_ciphers:         OpenSSL cipher list for TLS 1.2 (of rustls's six ECDHE
                          AES-GCM/ChaCha20 suites; a list with none of them exits)
   - ssl_keyformat:       1 (PEM) only
   - memcached's allocator, hash table, LRU and crawler tuning (maxconns_fast,
     hashpower, tail_repair_time, hash_algorithm, lru_maintainer, hot_lru_pct,
     warm_lru_pct, temporary_ttl, slab_reassign, slab_automove, slab_chunk_max,
     read_buf_mem_limit, worker_logbuf_size, modern, ...): accepted, no effect
Accepted with no effect (said once on stderr): -t <num> (one worker per CPU),
  -u <user>, -r, -L, -k, -a <mask>, -f <factor>, -n <bytes>, -N <num>
Refused (exit 64): -s, -S and -o options of features not served here
-- <serve kv options>     the rest goes to `corelocal serve kv` (e.g. --backend,
                          --cpus, --metrics; `corelocal serve kv --help`)
--config-file=<file>      read options from a memcached.conf as Debian's
                          systemd-memcached-wrapper does (corelocal's own option)
Environment: MEMCACHED_PORT_FILENAME=<file> gets the bound ports, as memcached writes them.
",
        version = env!("CARGO_PKG_VERSION")
    )
}
