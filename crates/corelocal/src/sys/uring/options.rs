//! Socket options a handler asks for between two parts of its output (`Op::SetOptions`: the
//! kernel's TLS after a user-space handshake), set with the socket uring_cmd
//! `SOCKET_URING_OP_SETSOCKOPT` on the direct descriptor (there is no ordinary one to call
//! `setsockopt` on).
//!
//! One SQE per option, unlinked, in order: the kernel issues SQEs in submission order and a
//! socket command runs inline when issued, so each has read its value before the submit
//! returns, and an option after a failed one fails on its own (TLS_TX without the `tls` ULP:
//! ENOPROTOOPT). The values stay in the slot until every CQE came (or the slot is reused).

use super::state::{user_data, KIND_OPTIONS};
use super::UringBackend;
use crate::backend::{Completion, ConnId, SocketOption};
use io_uring::{opcode, types};
use std::io;

/// Options set in one go: more would be a handler's bug (kTLS sets two).
const OPTIONS_MAX: usize = 8;

/// Options with the kernel: their values, CQEs still to come, the first error.
#[derive(Debug)]
pub(super) struct OptionsInFlight {
    _values: Vec<SocketOption>,
    outstanding: usize,
    error: Option<io::Error>,
}

impl UringBackend {
    pub(super) fn set_options(&mut self, conn: ConnId, options: Vec<SocketOption>) {
        assert!(
            options.len() <= OPTIONS_MAX,
            "too many socket options at once"
        );
        if options.is_empty() {
            self.ready.push_back(Completion::OptionsSet {
                conn,
                result: Ok(()),
            });
            return;
        }
        let key = self.slots.key(conn);
        for option in &options {
            // The value's heap buffer does not move when `options` moves into the slot below.
            let entry = opcode::SetSockOpt::new(
                types::Fixed(conn),
                option.level as u32,
                option.name as u32,
                option.value.as_ptr().cast::<libc::c_void>(),
                option.value.len() as u32,
            )
            .build()
            .user_data(user_data(KIND_OPTIONS, key));
            self.sqe(entry);
        }
        let slot = &mut self.slots[conn];
        assert!(
            slot.options.is_none(),
            "one set of socket options at a time"
        );
        slot.ulp |= options.iter().any(SocketOption::attaches_ulp);
        slot.options = Some(OptionsInFlight {
            outstanding: options.len(),
            _values: options,
            error: None,
        });
    }

    /// One option's CQE; the last one reports them all (Ok, or the first error).
    pub(super) fn on_option(&mut self, conn: ConnId, res: i32) {
        let slot = &mut self.slots[conn];
        let Some(flight) = slot.options.as_mut() else {
            return;
        };
        if res < 0 && flight.error.is_none() {
            flight.error = Some(io::Error::from_raw_os_error(-res));
        }
        flight.outstanding -= 1;
        if flight.outstanding > 0 {
            return;
        }
        let result = match slot.options.take().and_then(|f| f.error) {
            Some(error) => Err(error),
            None => Ok(()),
        };
        self.ready
            .push_back(Completion::OptionsSet { conn, result });
    }
}
