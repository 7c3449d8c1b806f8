//! Pure parsers for the `/proc` text `steer` reads (tested on fixture text): listening TCP
//! sockets (`net/tcp`, `net/tcp6`), descriptor links (`fd/N`), epoll interest lists
//! (`fdinfo/N` `tfd:` lines), process parents (`stat`) and what a thread is blocked in
//! (`task/TID/syscall`).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `st` of a listening socket in `/proc/net/tcp`.
const TCP_LISTEN_STATE: &str = "0A";

/// One listening TCP socket from `/proc/PID/net/tcp[6]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ListenEntry {
    /// Socket inode (what `fd/N` links to as `socket:[INODE]`).
    pub inode: u64,
    /// Local address.
    pub addr: SocketAddr,
}

/// Parses `/proc/net/tcp` (`v6 = false`) or `/proc/net/tcp6` text; returns the listeners.
pub fn parse_net_tcp(text: &str, v6: bool) -> Vec<ListenEntry> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(3) != Some(&TCP_LISTEN_STATE) {
                return None;
            }
            let addr = parse_hex_addr(f.get(1)?, v6)?;
            let inode = f.get(9)?.parse().ok()?;
            // Inode 0: a socket being torn down; nobody holds it.
            (inode != 0).then_some(ListenEntry { inode, addr })
        })
        .collect()
}

/// `0100007F:1F90` (v4) or 32 hex digits + port (v6); each 32-bit word is in host order.
fn parse_hex_addr(text: &str, v6: bool) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(
            u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
                .ok()?
                .to_ne_bytes(),
        )
    };
    if v6 {
        if ip.len() != 32 {
            return None;
        }
        let mut octets = [0u8; 16];
        for i in 0..4 {
            octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
        }
        Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(octets),
            port,
            0,
            0,
        )))
    } else {
        if ip.len() != 8 {
            return None;
        }
        Some(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::from(word(0)?),
            port,
        )))
    }
}

/// What a descriptor is, from its `/proc/PID/fd/N` link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdKind {
    /// `socket:[INODE]`.
    Socket(u64),
    /// `anon_inode:[eventpoll]`.
    Epoll,
    /// `anon_inode:bpf-prog`: a loaded BPF program.
    BpfProg,
    /// Anything else.
    Other,
}

/// Classifies a `/proc/PID/fd/N` link target.
pub fn parse_fd_link(link: &str) -> FdKind {
    if let Some(inode) = link
        .strip_prefix("socket:[")
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse().ok())
    {
        return FdKind::Socket(inode);
    }
    if link == "anon_inode:[eventpoll]" {
        return FdKind::Epoll;
    }
    if link == "anon_inode:bpf-prog" {
        return FdKind::BpfProg;
    }
    FdKind::Other
}

/// `(prog_type, prog_id)` from a BPF program descriptor's `/proc/PID/fdinfo/N`
/// (`prog_type:\t21` … `prog_id:\t57`).
pub fn parse_bpf_prog_fdinfo(text: &str) -> Option<(u32, u32)> {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|v| v.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
    };
    Some((field("prog_type")?, field("prog_id")?))
}

/// One entry of an epoll instance's interest list (`tfd:` line of its fdinfo).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpollTarget {
    /// The watched descriptor number (in the process that registered it).
    pub tfd: i32,
    /// Inode of the watched file (printed in hex by the kernel).
    pub inode: u64,
}

/// Parses the `tfd:` lines of an epoll descriptor's `/proc/PID/fdinfo/N`:
/// `tfd:        6 events:       19 data:                6  pos:0 ino:3d2a sdev:8`.
pub fn parse_epoll_fdinfo(text: &str) -> Vec<EpollTarget> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("tfd:")?;
            let tfd = rest.split_whitespace().next()?.parse().ok()?;
            let ino = rest
                .split_whitespace()
                .find_map(|w| w.strip_prefix("ino:"))?;
            let inode = u64::from_str_radix(ino, 16).ok()?;
            Some(EpollTarget { tfd, inode })
        })
        .collect()
}

/// `(ppid, comm)` from `/proc/PID/stat` (comm may hold spaces and parentheses).
pub fn parse_stat_parent(text: &str) -> Option<(u32, String)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let _state = rest.next()?;
    Some((rest.next()?.parse().ok()?, comm))
}

/// Process start time (field 22, clock ticks since boot) from `/proc/PID/stat`: with the PID
/// it names one process even when PIDs are reused.
pub fn parse_stat_start_ticks(text: &str) -> Option<u64> {
    let rest = text.get(text.rfind(')')? + 1..)?;
    // rest[0] is field 3 (state): field 22 is rest[19].
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// What `/proc/PID/task/TID/syscall` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syscall {
    /// The thread is running (no syscall to report).
    Running,
    /// Blocked in syscall `nr` with first argument `arg0`.
    Blocked {
        /// Syscall number.
        nr: i64,
        /// First argument.
        arg0: u64,
    },
}

/// Parses `232 0x5 0x7ffd… …` or `running`; `None` for anything else (`-1 …`: not in a
/// syscall).
pub fn parse_syscall(text: &str) -> Option<Syscall> {
    let mut f = text.split_whitespace();
    let first = f.next()?;
    if first == "running" {
        return Some(Syscall::Running);
    }
    let nr: i64 = first.parse().ok()?;
    if nr < 0 {
        return None;
    }
    let arg0 = u64::from_str_radix(f.next()?.trim_start_matches("0x"), 16).ok()?;
    Some(Syscall::Blocked { nr, arg0 })
}

/// What a blocked thread waits on, for the syscalls that name one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waits {
    /// `epoll_wait` / `epoll_pwait` / `epoll_pwait2` on this epoll descriptor.
    Epoll(i32),
    /// `accept` / `accept4` on this descriptor.
    Accept(i32),
    /// A multiplexer whose descriptors are not visible (`poll`, `select`, `io_uring_enter`, …).
    Opaque,
    /// Something else (a lock, a sleep, a read).
    Other,
}

/// Classifies a blocked syscall (x86-64 and aarch64 numbers).
pub fn waits_on(call: Syscall) -> Option<Waits> {
    let Syscall::Blocked { nr, arg0 } = call else {
        return None;
    };
    let fd = arg0 as i32;
    #[cfg(target_arch = "aarch64")]
    let w = match nr {
        22 | 441 => Waits::Epoll(fd),
        202 | 242 => Waits::Accept(fd),
        72 | 73 | 426 => Waits::Opaque,
        _ => Waits::Other,
    };
    #[cfg(not(target_arch = "aarch64"))]
    let w = match nr {
        232 | 281 | 441 => Waits::Epoll(fd),
        43 | 288 => Waits::Accept(fd),
        7 | 23 | 270 | 271 | 426 => Waits::Opaque,
        _ => Waits::Other,
    };
    Some(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41523 1 0000000000000000 100 0 0 10 0
   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000    33        0 41524 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:D2C4 01 00000000:00000000 00:00000000 00000000    33        0 51000 1 0000000000000000 20 4 30 10 -1
";
    const NET_TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41530 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn listeners_from_net_tcp() {
        let v4 = parse_net_tcp(NET_TCP, false);
        assert_eq!(
            v4,
            vec![
                ListenEntry {
                    inode: 41523,
                    addr: "127.0.0.1:8080".parse().unwrap()
                },
                ListenEntry {
                    inode: 41524,
                    addr: "0.0.0.0:80".parse().unwrap()
                },
            ]
        );
        let v6 = parse_net_tcp(NET_TCP6, true);
        assert_eq!(v6.len(), 1);
        assert_eq!(v6[0].addr, "[::1]:8080".parse().unwrap());
        assert_eq!(v6[0].inode, 41530);
        assert!(parse_net_tcp("header\n garbage line\n", false).is_empty());
    }

    #[test]
    fn fd_links() {
        assert_eq!(parse_fd_link("socket:[41523]"), FdKind::Socket(41523));
        assert_eq!(parse_fd_link("anon_inode:[eventpoll]"), FdKind::Epoll);
        assert_eq!(parse_fd_link("/var/log/nginx/access.log"), FdKind::Other);
        assert_eq!(parse_fd_link("socket:[x]"), FdKind::Other);
        assert_eq!(parse_fd_link("anon_inode:bpf-prog"), FdKind::BpfProg);
    }

    #[test]
    fn bpf_prog_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nprog_type:\t21\n\
            prog_jited:\t1\nprog_tag:\t3b185187f1855c4c\nmemlock:\t4096\nprog_id:\t57\n\
            run_time_ns:\t0\nrun_cnt:\t0\nrecursion_misses:\t0\nverified_insns:\t9\n";
        assert_eq!(parse_bpf_prog_fdinfo(text), Some((21, 57)));
        assert_eq!(parse_bpf_prog_fdinfo("pos:\t0\n"), None);
    }

    #[test]
    fn epoll_interest_list_inodes_are_hex() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\n\
            tfd:        6 events:       19 data:                6  pos:0 ino:a233 sdev:8\n\
            tfd:       11 events:       19 data:     7f00aa001230  pos:0 ino:a234 sdev:8\n";
        assert_eq!(
            parse_epoll_fdinfo(text),
            vec![
                EpollTarget {
                    tfd: 6,
                    inode: 0xa233
                },
                EpollTarget {
                    tfd: 11,
                    inode: 0xa234
                },
            ]
        );
    }

    #[test]
    fn stat_parent_and_start_time() {
        let text = "4242 (nginx: worker) S 4241 4241 4241 0 -1 4194624 153 0 0 0 0 0 0 0 20 0 1 0 9876543 10000 200 18446744073709551615";
        assert_eq!(
            parse_stat_parent(text),
            Some((4241, "nginx: worker".to_string()))
        );
        assert_eq!(parse_stat_start_ticks(text), Some(9876543));
        assert_eq!(
            parse_stat_parent("7 (a) b)) R 1 7 7"),
            Some((1, "a) b)".to_string()))
        );
    }

    #[test]
    fn syscalls() {
        let s = parse_syscall("232 0x5 0x55d0 0x200 0xffffffff 0x0 0x0 0x7ffd 0x7f12\n").unwrap();
        assert_eq!(s, Syscall::Blocked { nr: 232, arg0: 5 });
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(waits_on(s), Some(Waits::Epoll(5)));
            let a = parse_syscall("288 0x7 0x0 0x0 0x80800 0x0 0x0 0x7ffd 0x7f12").unwrap();
            assert_eq!(waits_on(a), Some(Waits::Accept(7)));
            let u = parse_syscall("426 0x9 0x0 0x1 0x1 0x0 0x8 0x7ffd 0x7f12").unwrap();
            assert_eq!(waits_on(u), Some(Waits::Opaque));
        }
        assert_eq!(parse_syscall("running"), Some(Syscall::Running));
        assert_eq!(waits_on(Syscall::Running), None);
        assert_eq!(parse_syscall("-1 0x7ffd 0x7f12"), None);
    }
}
