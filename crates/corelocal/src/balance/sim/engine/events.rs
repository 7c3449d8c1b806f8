//! The events: a connection's arrival and SYN, a core's finished job (a processed SYN, a
//! served batch), the end of a think time, and the migration / sampling tick.

use super::{Conn, Ev, Job, Sim, NS_PER_MS, NS_PER_S, TICK_NS};
use crate::balance::sim::{BalancerMode, BATCHES, CONNS_MAX};

impl Sim {
    pub(super) fn on_arrival(&mut self) {
        let id = self.conns.len() as u32;
        assert!((id as u64) < CONNS_MAX, "connection limit reached");
        let group = self.rng.below(self.cfg.flow_groups);
        self.conns.push(Conn {
            t0_ns: self.now_ns,
            group,
            batch: 0,
            syn_tries: 0,
            app_core: u32::MAX,
            done: false,
        });
        self.s.arrivals[Self::sec(self.now_ns)] += 1;
        self.send_syn(id);
        self.next_arrival_ns += self.rng.exp(self.mean_interarrival_ns);
        let next = (self.next_arrival_ns as u64).max(self.now_ns);
        if next < self.arrivals_end_ns {
            self.schedule(next, Ev::Arrival);
        }
    }

    /// The group's owner gets the SYN (softirq).
    pub(super) fn send_syn(&mut self, conn: u32) {
        let core = self.table.owner(self.conns[conn as usize].group);
        self.cores[core]
            .soft
            .push_back(Job::Soft { conn, first: true });
        self.kick(core);
    }

    pub(super) fn on_core_done(&mut self, core: usize) {
        let job = self.cores[core].current.take().expect("a running job");
        match job {
            Job::Soft { conn, first: true } => self.on_syn_processed(core, conn),
            Job::Soft { conn, first: false } => {
                if !self.conns[conn as usize].done {
                    let app = self.conns[conn as usize].app_core as usize;
                    self.cores[app].runq.push_back(conn);
                    self.kick(app);
                }
            }
            Job::Accept { conn, live } => {
                if live {
                    self.conns[conn as usize].app_core = core as u32;
                    self.cores[core].runq.push_back(conn);
                } else {
                    self.timeout(conn);
                }
            }
            Job::StealFail => {}
            Job::App { conn } => self.on_batch_served(core, conn),
        }
        self.pick(core);
    }

    fn on_syn_processed(&mut self, core: usize, conn: u32) {
        if self.conns[conn as usize].done {
            return;
        }
        if self.expired(conn) {
            self.timeout(conn);
            return;
        }
        if self.cores[core].accq.len() >= self.cfg.queue_cap as usize {
            // Full queue: the SYN is dropped; the client retransmits after 1 s, 2 s, 4 s...
            self.syn_drops += 1;
            self.s.syn_drops[Self::sec(self.now_ns)] += 1;
            if !self.watching() {
                self.observe(core);
            }
            let c = &mut self.conns[conn as usize];
            c.syn_tries += 1;
            let backoff = (1u64 << c.syn_tries.min(20)) - 1;
            let next = c.t0_ns + backoff * self.cfg.syn_rto_ms * NS_PER_MS;
            if next < self.deadline(conn) {
                self.syn_retransmits += 1;
                self.schedule(next, Ev::Syn(conn));
            } else {
                self.timeout(conn);
            }
            return;
        }
        self.cores[core].accq.push_back(conn);
        let own_thread_waits = self.wake_accept(core);
        if self.watching() {
            return; // the kernel wakes the owner only; busy state is the watchers' business
        }
        self.observe(core);
        if !own_thread_waits && self.busy.is_busy(core) && self.cfg.balancer != BalancerMode::Off {
            self.wake_one_stealer(core);
        }
    }

    fn on_batch_served(&mut self, core: usize, conn: u32) {
        let batch = self.conns[conn as usize].batch as usize;
        debug_assert_eq!(self.conns[conn as usize].app_core as usize, core);
        if batch + 1 == BATCHES.len() {
            self.conn_closed(core);
            if self.now_ns > self.deadline(conn) {
                self.timeout(conn);
            } else {
                self.complete(conn);
            }
        } else {
            self.conns[conn as usize].batch += 1;
            let t = self.now_ns + self.cfg.think_ms * NS_PER_MS;
            self.schedule(t, Ev::Think(conn));
        }
    }

    pub(super) fn on_think(&mut self, conn: u32) {
        if self.expired(conn) {
            let app = self.conns[conn as usize].app_core as usize;
            self.conn_closed(app);
            self.timeout(conn);
            return;
        }
        let owner = self.table.owner(self.conns[conn as usize].group);
        self.cores[owner]
            .soft
            .push_back(Job::Soft { conn, first: false });
        self.kick(owner);
    }

    pub(super) fn on_tick(&mut self) {
        let now = self.now_ns;
        for core in 0..self.cfg.cores {
            if let Some(req) = self.cores[core].bal.migration_tick(&self.busy, now) {
                if self.table.migrate(req).is_some() {
                    self.migrations += 1;
                    self.s.migrations[Self::sec(now)] += 1;
                }
            }
        }
        if now % NS_PER_S == 0 && now > 0 {
            let sec = Self::sec(now) - 1;
            self.s.busy_cores[sec] = self.busy.count() as u64;
            self.s.hogged_groups[sec] = self.hogged_groups();
        }
        if now + TICK_NS <= self.hard_end_ns {
            self.schedule(now + TICK_NS, Ev::Tick);
        }
    }
}
