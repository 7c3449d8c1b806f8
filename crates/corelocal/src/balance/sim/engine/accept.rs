//! The accept thread: one accept, from the local queue or stolen as the balancer chooses,
//! and its sleeping, waking and blocking on `inflight_max`.

use super::{AcceptState, Job, Sim, ACCEPT};
use crate::balance::AcceptFrom;

impl Sim {
    /// One accept by the accept thread: the balancer chooses local or a victim. Returns the
    /// job, its cost and whether the thread goes on accepting; `None` when there is nothing.
    pub(super) fn try_accept(&mut self, core: usize) -> Option<(Job, u64, bool)> {
        let local_ready = !self.cores[core].accq.is_empty();
        match self.cores[core].bal.choose_accept(&self.busy, local_ready) {
            AcceptFrom::Local => {
                let (job, cost) = self.accept_local(core);
                Some((job, cost, true))
            }
            AcceptFrom::Steal(victim) => {
                if let Some(conn) = self.cores[victim].accq.pop_front() {
                    self.observe(victim);
                    self.cores[core].bal.record_steal(victim, local_ready);
                    self.steals += 1;
                    self.s.steals[Self::sec(self.now_ns)] += 1;
                    Some((self.accept_job(core, conn), self.cfg.steal_ns, true))
                } else {
                    // The busy bit was stale; the failed attempt observes the empty queue.
                    self.observe(victim);
                    self.steal_failures += 1;
                    if local_ready {
                        let (job, cost) = self.accept_local(core);
                        Some((job, cost, true))
                    } else {
                        Some((Job::StealFail, self.cfg.steal_fail_ns, false))
                    }
                }
            }
            AcceptFrom::Nothing => None,
        }
    }

    /// A connection accepted by `core` closed (done or timed out): a blocked accept thread
    /// may go on.
    pub(super) fn conn_closed(&mut self, core: usize) {
        let c = &mut self.cores[core];
        c.inflight -= 1;
        if c.accept == AcceptState::Blocked && c.inflight < self.cfg.inflight_max {
            c.accept = AcceptState::Sleeping;
            self.wake_accept(core);
        }
    }

    /// Makes `core`'s sleeping accept thread ready (it queues behind the ready connections).
    /// Returns whether it was sleeping.
    pub(super) fn wake_accept(&mut self, core: usize) -> bool {
        let c = &mut self.cores[core];
        if c.accept != AcceptState::Sleeping {
            return false;
        }
        c.accept = AcceptState::Queued;
        // A woken accept thread (a sleeper with little CPU time) runs next, as a fair
        // scheduler's wakeup preemption (or an event loop polling its listener first) gives.
        c.runq.push_front(ACCEPT);
        self.kick(core);
        true
    }

    fn accept_local(&mut self, core: usize) -> (Job, u64) {
        let conn = self.cores[core]
            .accq
            .pop_front()
            .expect("local queue non-empty");
        self.observe(core);
        self.cores[core].bal.record_local();
        (self.accept_job(core, conn), self.cfg.accept_ns)
    }

    fn accept_job(&mut self, core: usize, conn: u32) -> Job {
        let live = !self.expired(conn);
        if live {
            self.cores[core].inflight += 1;
        }
        Job::Accept { conn, live }
    }
}
