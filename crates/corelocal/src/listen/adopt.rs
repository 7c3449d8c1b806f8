//! The listener group's side of a binary upgrade by socket passing: what the old process hands
//! over ([`ListenerGroup::handover_sockets`]), how it lets go of and takes back the steering
//! ([`ListenerGroup::release_steering`], [`ListenerGroup::restore_steering`]), and how the new
//! process rebuilds a group from the received sockets ([`ListenerGroup::adopt`]).

use super::error::{io_context, BadSocket, SocketProblem};
use super::group::validate;
use super::handover::Layout;
use super::steering::{attach_cbpf, attach_ebpf, first_listener, set_listener_patiently};
use super::{ActiveSteering, AddrGroup, GroupConfig, ListenError, ListenerGroup, Mode, Steering};
use crate::sys::socket;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

impl ListenerGroup {
    /// What a successor needs: the layout and every listening socket in layout order (address
    /// by address; per address the shared socket in `stock` mode, else one per worker). Fails
    /// when a worker's listener was closed ([`ListenerGroup::close_worker`]).
    pub fn handover_sockets(&self) -> Result<(Layout, Vec<RawFd>), ListenError> {
        let per_addr = self.layout_sockets_per_addr();
        let mut fds = Vec::with_capacity(self.groups.len() * per_addr);
        for g in &self.groups {
            for (w, listener) in g.listeners.iter().take(per_addr).enumerate() {
                let fd = listener.as_ref().ok_or_else(|| {
                    ListenError::Config(format!(
                        "worker {w}'s listener on {} is closed: nothing complete to hand over",
                        g.local_addr
                    ))
                })?;
                fds.push(fd.as_raw_fd());
            }
        }
        let layout = Layout {
            mode: self.config.mode,
            steering: self.steering,
            addrs: self.local_addrs(),
            worker_cpus: self.config.worker_cpus.clone(),
            kernel_order: self.groups.iter().map(|g| g.kernel_order.clone()).collect(),
        };
        Ok((layout, fds))
    }

    fn layout_sockets_per_addr(&self) -> usize {
        match self.config.mode {
            Mode::Stock => 1,
            _ => self.workers(),
        }
    }

    /// Before handing the sockets over: empties this group's eBPF sockarray so the successor
    /// can put the same sockets into its own (a socket sits in one sockarray at most). SYNs
    /// keep flowing meanwhile: an empty slot makes the program fall back to the kernel's hash
    /// over the same sockets, which this process still accepts from. Nothing to do for other
    /// steering methods.
    pub fn release_steering(&self) -> Result<(), ListenError> {
        for g in &self.groups {
            if let Some(sel) = &g.ebpf {
                for w in 0..self.workers() {
                    sel.clear_listener(w as u32)?;
                }
            }
        }
        Ok(())
    }

    /// After a handover that failed: takes the group's steering back, whatever the would-be
    /// successor attached. eBPF: re-attach this process's program (replacing any other), then
    /// refill its sockarray (waiting briefly for the other program's map to let go); cBPF:
    /// re-attach; hash and SO_INCOMING_CPU: detach any program.
    pub fn restore_steering(&self) -> Result<(), ListenError> {
        for g in &self.groups {
            let Some(first) = first_listener(g) else {
                continue;
            };
            match (&g.ebpf, self.steering) {
                (Some(sel), _) => {
                    socket::attach_reuseport_ebpf(first, sel.program_fd())
                        .map_err(io_context("SO_ATTACH_REUSEPORT_EBPF"))?;
                    for (w, fd) in g.listeners.iter().enumerate() {
                        if let Some(fd) = fd {
                            // Idempotent: a socket already in this map's slot would be EBUSY.
                            sel.clear_listener(w as u32)?;
                            set_listener_patiently(sel, w as u32, fd.as_raw_fd())?;
                        }
                    }
                }
                (None, ActiveSteering::Local(Steering::Cbpf)) => {
                    attach_cbpf(g, &self.config.worker_cpus)?
                }
                (None, _) => match socket::detach_reuseport_bpf(first) {
                    Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                        return Err(io_context("SO_DETACH_REUSEPORT_BPF")(e))
                    }
                    _ => {}
                },
            }
        }
        Ok(())
    }

    /// Builds a group from listening sockets received from a running server (binary upgrade):
    /// `config` must match `layout` (addresses, worker CPUs, mode; steering when forced — see
    /// [`Layout::check_matches`]), and each socket must be a listening TCP socket bound where
    /// the layout says. The group keeps the old steering method and attaches its own program
    /// (eBPF: a fresh program and maps filled with the adopted sockets, replacing the old
    /// process's program; cBPF: the same CPU table for the same kernel order). The sockets keep
    /// their backlog.
    pub fn adopt(
        config: GroupConfig,
        layout: &Layout,
        fds: Vec<OwnedFd>,
    ) -> Result<ListenerGroup, ListenError> {
        validate(&config)?;
        let steering = layout
            .check_matches(&config)
            .map_err(ListenError::Mismatch)?;
        if fds.len() != layout.socket_count() {
            return Err(ListenError::BadSocket(BadSocket::Count {
                received: fds.len(),
                announced: layout.socket_count(),
            }));
        }
        let mut config = config;
        if let ActiveSteering::Local(method) = steering {
            config.steering = Some(method);
        }
        let per_addr = layout.sockets_per_addr();
        let mut fds = fds.into_iter();
        let mut groups = Vec::with_capacity(layout.addrs.len());
        for (a, &addr) in layout.addrs.iter().enumerate() {
            let sockets: Vec<Arc<OwnedFd>> = fds.by_ref().take(per_addr).map(Arc::new).collect();
            for (index, s) in sockets.iter().enumerate() {
                check_adopted(s.as_raw_fd(), addr, layout.mode).map_err(|problem| {
                    ListenError::BadSocket(BadSocket::Socket {
                        index,
                        addr,
                        problem,
                    })
                })?;
            }
            let listeners = (0..config.worker_cpus.len())
                .map(|w| Some(sockets[if per_addr == 1 { 0 } else { w }].clone()))
                .collect();
            let mut group = AddrGroup {
                local_addr: addr,
                listeners,
                kernel_order: layout.kernel_order[a].clone(),
                ebpf: None,
            };
            match steering {
                ActiveSteering::Local(Steering::Ebpf) => attach_ebpf(&mut group, &config)?,
                ActiveSteering::Local(Steering::Cbpf) => attach_cbpf(&group, &config.worker_cpus)?,
                _ => {}
            }
            groups.push(group);
        }
        Ok(ListenerGroup {
            config,
            steering,
            groups,
            adopted: true,
        })
    }
}

/// A received socket must listen on TCP, bound to `addr` (same family, address and port), and
/// be in a reuseport group unless the mode shares one socket.
fn check_adopted(fd: RawFd, addr: SocketAddr, mode: Mode) -> Result<(), SocketProblem> {
    let (domain, reuseport) = socket::tcp_listener_info(fd).map_err(SocketProblem::Query)?;
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    if domain != family {
        return Err(SocketProblem::Family);
    }
    let bound = socket::local_addr(fd).map_err(SocketProblem::Query)?;
    if bound != addr {
        return Err(SocketProblem::BoundTo(bound));
    }
    if mode != Mode::Stock && !reuseport {
        return Err(SocketProblem::NotReuseport);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listen::handover::Message;
    use crate::sys::scm;
    use std::time::{Duration, Instant};

    fn config(mode: Mode) -> GroupConfig {
        GroupConfig::new(vec!["127.0.0.1:0".parse().unwrap()], vec![0, 0], mode)
    }

    /// Passes `group`'s sockets through a real SCM_RIGHTS round trip, as another process
    /// would receive them.
    fn pass(group: &ListenerGroup) -> (Layout, Vec<OwnedFd>) {
        let (layout, raws) = group.handover_sockets().unwrap();
        let (a, b) = scm::seqpacket_pair().unwrap();
        scm::send_with_fds(a.as_raw_fd(), &Message::Offer(layout).encode(), &raws).unwrap();
        let mut buf = vec![0u8; 4096];
        let (n, fds) = scm::recv_with_fds(b.as_raw_fd(), &mut buf, raws.len()).unwrap();
        let Ok(Message::Offer(layout)) = Message::decode(&buf[..n]) else {
            panic!("offer expected");
        };
        (layout, fds)
    }

    fn config_for(layout: &Layout) -> GroupConfig {
        GroupConfig::new(
            layout.addrs.clone(),
            layout.worker_cpus.clone(),
            layout.mode,
        )
    }

    /// One connection through the group's address is accepted from one of `listeners`.
    fn accepted_by(addr: SocketAddr, listeners: &[RawFd]) -> bool {
        let _client = std::net::TcpStream::connect(addr).unwrap();
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            if listeners.iter().any(|&l| super::super::accept(l).is_ok()) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn a_fine_group_is_adopted_socket_for_socket() {
        let old = ListenerGroup::bind(config(Mode::Fine)).unwrap();
        let (layout, fds) = pass(&old);
        assert_eq!(fds.len(), 2);
        let new = ListenerGroup::adopt(config_for(&layout), &layout, fds).unwrap();
        assert_eq!(new.local_addrs(), old.local_addrs());
        assert_eq!(new.steering(), ActiveSteering::KernelHash);
        let new_fds: Vec<RawFd> = (0..2).flat_map(|w| new.listeners(w)).collect();
        drop(old); // the sockets live on in `new`: nothing closes, nothing is reset
        assert!(accepted_by(new.local_addrs()[0], &new_fds));
        assert_eq!(new.release_steering().map_err(|e| e.to_string()), Ok(()));
        assert_eq!(new.restore_steering().map_err(|e| e.to_string()), Ok(()));
    }

    #[test]
    fn a_stock_group_passes_its_one_shared_socket() {
        let old = ListenerGroup::bind(config(Mode::Stock)).unwrap();
        let (layout, fds) = pass(&old);
        assert_eq!(fds.len(), 1);
        let new = ListenerGroup::adopt(config_for(&layout), &layout, fds).unwrap();
        assert_eq!(new.listeners(0), new.listeners(1));
    }

    #[test]
    fn a_mismatch_or_a_wrong_socket_is_refused() {
        let old = ListenerGroup::bind(config(Mode::Fine)).unwrap();
        let (layout, fds) = pass(&old);
        let mut other = config_for(&layout);
        other.worker_cpus = vec![0, 1];
        let e = ListenerGroup::adopt(other, &layout, fds).unwrap_err();
        assert!(e.to_string().contains("worker CPUs"), "{e}");

        let (layout, mut fds) = pass(&old);
        fds.pop();
        let e = ListenerGroup::adopt(config_for(&layout), &layout, fds).unwrap_err();
        assert!(e.to_string().contains("received 1 sockets"), "{e}");

        // A connected (not listening) TCP socket in place of a listener.
        let (layout, mut fds) = pass(&old);
        let stray = std::net::TcpStream::connect(old.local_addrs()[0]).unwrap();
        fds[1] = OwnedFd::from(stray);
        let e = ListenerGroup::adopt(config_for(&layout), &layout, fds).unwrap_err();
        assert!(e.to_string().contains("not listening"), "{e}");

        // A listener bound elsewhere.
        let (layout, mut fds) = pass(&old);
        fds[0] = OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let e = ListenerGroup::adopt(config_for(&layout), &layout, fds).unwrap_err();
        assert!(e.to_string().contains("the layout says"), "{e}");
    }

    #[test]
    fn ebpf_steering_moves_to_the_adopting_group_only_after_release() {
        if !crate::testing::root_or_skip(
            "ebpf_steering_moves_to_the_adopting_group_only_after_release",
        ) {
            return;
        }
        let mut cfg = config(Mode::Local);
        cfg.steering = Some(Steering::Ebpf);
        let old = ListenerGroup::bind(cfg).unwrap();
        // Without release the sockets still sit in the old sockarray: adopting must fail.
        let (layout, fds) = pass(&old);
        let e = ListenerGroup::adopt(config_for(&layout), &layout, fds).unwrap_err();
        assert!(e.to_string().contains("EBUSY"), "{e}");
        old.restore_steering().unwrap();
        // Released, the new group fills its own map and takes the group's SYNs.
        old.release_steering().unwrap();
        let (layout, fds) = pass(&old);
        let new = ListenerGroup::adopt(config_for(&layout), &layout, fds).unwrap();
        assert_eq!(new.steering(), ActiveSteering::Local(Steering::Ebpf));
        let new_fds: Vec<RawFd> = (0..2).flat_map(|w| new.listeners(w)).collect();
        assert!(accepted_by(new.local_addrs()[0], &new_fds));
        // A failed handover: the old group takes its steering back from the new program.
        drop(new);
        old.restore_steering().unwrap();
        let old_fds: Vec<RawFd> = (0..2).flat_map(|w| old.listeners(w)).collect();
        assert!(accepted_by(old.local_addrs()[0], &old_fds));
    }
}
