//! Knowing when not to act: a reuseport program on the group that is not ours.
//!
//! The kernel has no call that reads back the program attached to a reuseport group (there
//! is no getsockopt for `SO_ATTACH_REUSEPORT_EBPF`, `SO_DETACH_REUSEPORT_BPF` destroys what
//! it finds, and neither sock_diag nor `BPF_PROG_QUERY` covers reuseport). What can be seen
//! on Linux 6.18, and is checked here:
//! - every loaded eBPF program (`BPF_PROG_GET_NEXT_ID`, CAP_SYS_ADMIN) of a type that can be
//!   attached to a group (SK_REUSEPORT, SOCKET_FILTER), whose socket maps
//!   (REUSEPORT_SOCKARRAY, SOCKMAP) hold a listener of the group — a socket sits in one
//!   sockarray at most, so this names the program that selects among the group's listeners
//!   even after its owner closed every descriptor;
//! - such programs held open by the server's own processes (`/proc/PID/fd` →
//!   `anon_inode:bpf-prog`, `prog_type` in its fdinfo): a server that steers its group itself
//!   (our own runtime in `local` mode, a server patched for `SO_ATTACH_REUSEPORT_EBPF`). One
//!   whose socket maps hold only other sockets (nginx's QUIC program, on its UDP sockets) is
//!   attached elsewhere and passes; one without socket maps cannot be placed and counts.
//!
//! - what the kernel itself has attached to each listener's group, read by a BPF iterator
//!   over the namespace's TCP sockets ([`super::iter`]): this also sees a classic BPF program
//!   (`SO_ATTACH_REUSEPORT_CBPF`, which gets no id) and an eBPF one whose maps cannot be read
//!   (SOCKHASH, or none). It needs kernel BTF and CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN);
//!   without them `attach` says that a classic program would not be seen.

use super::SteerError;
use crate::plan::{GroupPlan, HeldProg};
use corelocal::bpf::cpu_pick::{PROGS_SCANNED_MAX, PROG_NAME};
use corelocal::sys::bpf::{self, Map, ProgType, Program};
use serde::Serialize;
use std::collections::BTreeSet;

/// `BPF_MAP_TYPE_SOCKMAP`.
const MAP_SOCKMAP: u32 = 15;
/// `BPF_MAP_TYPE_REUSEPORT_SOCKARRAY`.
const MAP_SOCKARRAY: u32 = 20;
/// Most entries read from one socket map.
pub const SOCKMAP_ENTRIES_READ_MAX: u32 = 65_536;

/// A reuseport program found on (or possibly on) a group that steer did not attach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForeignProgram {
    /// The program's id.
    pub prog_id: u32,
    /// Its name (up to 15 bytes; empty when loaded without one).
    pub name: String,
    /// `sk_reuseport` or `socket_filter`.
    pub prog_type: &'static str,
    /// Server processes holding it open: (pid, fd).
    pub held_by: Vec<(u32, i32)>,
    /// How many of the group's listeners its socket maps hold (0: it has no readable socket
    /// map, so it cannot be placed).
    pub listeners_in_maps: usize,
    /// Seen attached to the group by the kernel itself ([`super::iter`]).
    pub attached_seen: bool,
}

impl ForeignProgram {
    /// One line for a refusal or a log.
    pub fn describe(&self, group_listeners: usize) -> String {
        let name = if self.name.is_empty() {
            "unnamed".to_string()
        } else {
            format!("`{}`", self.name)
        };
        let held = if self.held_by.is_empty() {
            "held by no process (attached, its loader closed it)".to_string()
        } else {
            let who: Vec<String> = self
                .held_by
                .iter()
                .map(|(pid, fd)| format!("fd {fd} of pid {pid}"))
                .collect();
            format!("held by the server ({})", who.join(", "))
        };
        let evidence = if self.attached_seen {
            "the kernel shows it attached to the group (BPF iterator over TCP sockets)".to_string()
        } else if self.listeners_in_maps > 0 {
            format!(
                "its socket map holds {} of the group's {group_listeners} listeners",
                self.listeners_in_maps
            )
        } else {
            "it has no socket map we can read, so it may be attached to this group".to_string()
        };
        if self.prog_id == 0 {
            return format!("a classic BPF program (SO_ATTACH_REUSEPORT_CBPF, no id): {evidence}");
        }
        format!(
            "{} program {} {name}, {held}: {evidence}",
            self.prog_type, self.prog_id
        )
    }
}

fn type_name(t: u32) -> Option<&'static str> {
    if t == ProgType::SkReuseport as u32 {
        Some("sk_reuseport")
    } else if t == ProgType::SocketFilter as u32 {
        Some("socket_filter")
    } else {
        None
    }
}

/// Cookies of the sockets in `prog`'s readable socket maps, and whether it has any.
fn socket_map_cookies(prog: &Program) -> (BTreeSet<u64>, bool) {
    let mut cookies = BTreeSet::new();
    let mut any = false;
    let Ok(info) = prog.info() else {
        return (cookies, any);
    };
    for map_id in info.map_ids {
        let Ok((map, minfo)) = Map::from_id(map_id) else {
            continue;
        };
        if !matches!(minfo.map_type, MAP_SOCKARRAY | MAP_SOCKMAP) || minfo.key_size != 4 {
            continue;
        }
        // A user-space lookup returns the socket's cookie only for 8-byte values.
        if minfo.value_size != 8 {
            continue;
        }
        any = true;
        for slot in 0..minfo.max_entries.min(SOCKMAP_ENTRIES_READ_MAX) {
            if let Ok(Some(v)) = map.lookup(&slot.to_ne_bytes()) {
                if let Ok(b) = <[u8; 8]>::try_from(v.as_slice()) {
                    cookies.insert(u64::from_ne_bytes(b));
                }
            }
        }
    }
    (cookies, any)
}

/// Reuseport programs that are not ours and are (or may be) attached to `group`: by socket
/// map contents among all loaded programs, and among those the server holds open. Needs
/// CAP_SYS_ADMIN to list and open programs; without it, only the held ones' fdinfo is known
/// and those are reported as unplaceable.
pub fn foreign_programs(
    group: &GroupPlan,
    held: &[HeldProg],
) -> Result<Vec<ForeignProgram>, SteerError> {
    let members: BTreeSet<u64> = group.listeners.iter().map(|l| l.cookie).collect();
    let mut out: Vec<ForeignProgram> = Vec::new();
    let ids = bpf::prog_ids(PROGS_SCANNED_MAX).map_err(|e| {
        SteerError(format!(
            "cannot list BPF programs ({e}): looking for a reuseport program the server or \
             someone else attached needs CAP_SYS_ADMIN"
        ))
    })?;
    let held_ids: BTreeSet<u32> = held.iter().map(|h| h.prog_id).collect();
    for id in ids {
        let Ok(prog) = Program::from_id(id) else {
            continue;
        };
        let Ok(info) = prog.info() else { continue };
        let Some(kind) = type_name(info.prog_type) else {
            continue;
        };
        if info.name == PROG_NAME {
            // Ours (on this group it is found by `find_attached`; on another group it is
            // none of this group's business).
            continue;
        }
        let is_held = held_ids.contains(&id);
        if !is_held && info.map_ids.is_empty() {
            // Some other socket's filter, or a program nobody here holds that selects
            // without a socket map: nothing ties it to this group.
            continue;
        }
        let (cookies, has_maps) = socket_map_cookies(&prog);
        let inside = cookies.intersection(&members).count();
        let counts = inside > 0 || (is_held && !has_maps && kind == "sk_reuseport");
        if !counts {
            continue;
        }
        out.push(ForeignProgram {
            prog_id: id,
            name: info.name,
            prog_type: kind,
            held_by: held
                .iter()
                .filter(|h| h.prog_id == id)
                .map(|h| (h.pid, h.fd))
                .collect(),
            listeners_in_maps: inside,
            attached_seen: false,
        });
    }
    // What the kernel itself has on the group, when the iterator can run (it also sees
    // classic BPF and programs without readable maps).
    if let Ok(seen) = super::iter::by_cookie() {
        add_seen(group, &seen, held, &mut out);
    }
    Ok(out)
}

/// Adds (or marks) the programs the iterator saw attached to the group's listeners.
fn add_seen(
    group: &GroupPlan,
    seen: &std::collections::BTreeMap<u64, super::iter::ListenerProg>,
    held: &[HeldProg],
    out: &mut Vec<ForeignProgram>,
) {
    for l in &group.listeners {
        let Some(rec) = seen.get(&l.cookie) else {
            continue;
        };
        if !rec.has_prog {
            continue;
        }
        if let Some(f) = out.iter_mut().find(|f| f.prog_id == rec.prog_id) {
            f.attached_seen = true;
            continue;
        }
        let (name, kind) = if rec.prog_id == 0 {
            ("classic BPF".to_string(), "classic BPF")
        } else {
            let name = Program::from_id(rec.prog_id)
                .and_then(|p| p.info())
                .map_or(String::new(), |i| i.name);
            (name, type_name(rec.prog_type).unwrap_or("other"))
        };
        if name == PROG_NAME {
            continue;
        }
        out.push(ForeignProgram {
            prog_id: rec.prog_id,
            name,
            prog_type: kind,
            held_by: held
                .iter()
                .filter(|h| rec.prog_id != 0 && h.prog_id == rec.prog_id)
                .map(|h| (h.pid, h.fd))
                .collect(),
            listeners_in_maps: 0,
            attached_seen: true,
        });
    }
}

/// What is on the group, one line: "a reuseport program … is on the group (…)".
pub fn summary(group: &GroupPlan, found: &[ForeignProgram]) -> String {
    let each: Vec<String> = found
        .iter()
        .map(|f| f.describe(group.listeners.len()))
        .collect();
    format!(
        "{}: a reuseport program that corelocal steer did not attach is on the group ({})",
        group.addr,
        each.join("; ")
    )
}

/// The refusal for a group with a foreign program, saying what would work.
pub fn refusal(group: &GroupPlan, found: &[ForeignProgram]) -> String {
    format!(
        "{}; the server (or its operator) already chooses the listener for each SYN, and \
         attaching would replace that choice; nothing changed. To replace it anyway: --force \
         (undo: `corelocal steer detach` removes only ours, so the server's program must then \
         be attached again by the server, e.g. by restarting it)",
        summary(group, found)
    )
}
