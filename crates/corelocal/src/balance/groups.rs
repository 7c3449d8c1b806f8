//! The flow-group table: flow group → worker, with O(1) moves.

use super::{MigrationRequest, FLOW_GROUPS_MAX, WORKERS_MAX};

/// One flow group moved by [`FlowGroupTable::migrate`]: write `override[group] = to` (socket
/// level) and `cpu_of_group[group] = cpu(to)` (packet level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The flow group.
    pub group: u32,
    /// Its old owner.
    pub from: usize,
    /// Its new owner.
    pub to: usize,
}

/// Flow group → worker (seed 000 §3.1: "flow groups", §3.3.2: migration). `G` groups, a
/// power of two; a connection's group is `hash & (G - 1)`. Every group always has exactly one
/// valid owner; each worker's groups are kept in a list so a move is O(1).
#[derive(Debug, Clone)]
pub struct FlowGroupTable {
    owner: Box<[u16]>,
    /// Index of each group in its owner's list.
    slot: Box<[u32]>,
    members: Vec<Vec<u32>>,
    moves: u64,
    moved_in: Box<[u64]>,
    moved_out: Box<[u64]>,
}

impl FlowGroupTable {
    /// `groups` groups (a power of two ≤ [`FLOW_GROUPS_MAX`]) spread over `workers` workers
    /// round-robin: group g → worker g mod `workers` (what RSS-style spreading gives).
    pub fn new(groups: u32, workers: usize) -> Self {
        assert!(
            groups.is_power_of_two() && groups <= FLOW_GROUPS_MAX,
            "groups must be a power of two"
        );
        assert!(
            workers > 0 && workers <= WORKERS_MAX,
            "workers out of range"
        );
        let mut members = vec![Vec::new(); workers];
        let mut owner = Vec::with_capacity(groups as usize);
        let mut slot = Vec::with_capacity(groups as usize);
        for g in 0..groups {
            let w = g as usize % workers;
            owner.push(w as u16);
            slot.push(members[w].len() as u32);
            members[w].push(g);
        }
        FlowGroupTable {
            owner: owner.into_boxed_slice(),
            slot: slot.into_boxed_slice(),
            members,
            moves: 0,
            moved_in: vec![0; workers].into_boxed_slice(),
            moved_out: vec![0; workers].into_boxed_slice(),
        }
    }

    /// Number of groups.
    pub fn groups(&self) -> u32 {
        self.owner.len() as u32
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.members.len()
    }

    /// The group of a flow hash: `hash & (G - 1)`.
    pub fn group_of_hash(&self, hash: u32) -> u32 {
        hash & (self.groups() - 1)
    }

    /// The worker owning `group`.
    pub fn owner(&self, group: u32) -> usize {
        usize::from(self.owner[group as usize])
    }

    /// The groups `worker` owns (in no particular order).
    pub fn groups_of(&self, worker: usize) -> &[u32] {
        &self.members[worker]
    }

    /// Carries out `req`: moves one of `req.from`'s groups (the last of its list) to `req.to`.
    /// `None` when `from` owns no group or `from == to`.
    pub fn migrate(&mut self, req: MigrationRequest) -> Option<Move> {
        assert!(
            req.from < self.workers() && req.to < self.workers(),
            "worker out of range"
        );
        if req.from == req.to {
            return None;
        }
        let group = *self.members[req.from].last()?;
        self.assign(group, req.to);
        Some(Move {
            group,
            from: req.from,
            to: req.to,
        })
    }

    /// Gives `group` to `worker` (also for tables restored from elsewhere).
    pub fn assign(&mut self, group: u32, worker: usize) {
        assert!(worker < self.workers(), "worker out of range");
        let from = self.owner(group);
        if from == worker {
            return;
        }
        let list = &mut self.members[from];
        let at = self.slot[group as usize] as usize;
        debug_assert_eq!(list[at], group);
        list.swap_remove(at);
        if let Some(&moved) = list.get(at) {
            self.slot[moved as usize] = at as u32;
        }
        self.slot[group as usize] = self.members[worker].len() as u32;
        self.members[worker].push(group);
        self.owner[group as usize] = worker as u16;
        self.moves += 1;
        self.moved_out[from] += 1;
        self.moved_in[worker] += 1;
    }

    /// Total moves so far.
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// Groups moved to `worker` so far.
    pub fn moved_in(&self, worker: usize) -> u64 {
        self.moved_in[worker]
    }

    /// Groups moved away from `worker` so far.
    pub fn moved_out(&self, worker: usize) -> u64 {
        self.moved_out[worker]
    }

    /// Checks the table's invariants (every group owned by a valid worker exactly once);
    /// panics if one is broken. O(G) — for tests and debug assertions.
    pub fn check(&self) {
        let mut seen = 0usize;
        for (w, list) in self.members.iter().enumerate() {
            for (i, &g) in list.iter().enumerate() {
                assert_eq!(self.owner(g), w, "group {g} listed under the wrong worker");
                assert_eq!(self.slot[g as usize] as usize, i, "group {g} slot stale");
                seen += 1;
            }
        }
        assert_eq!(seen, self.owner.len(), "groups lost or duplicated");
    }
}
