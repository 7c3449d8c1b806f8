//! What moves to a successor process at a binary upgrade besides the listening sockets: the
//! established connections (each with the bytes read but not yet handled and its handler's
//! state between requests) and the service's own state (kv's cache), as a byte stream.
//!
//! The service side is two traits, implemented by services with state worth keeping:
//! [`StateExport`] produces the stream in bounded chunks once the old process's workers have
//! stopped (nothing writes any more), [`StateImport`] consumes it in the new process before its
//! workers start. The runtime carries the chunks without looking inside them; the format, its
//! version and what a mismatch means belong to the service.

/// The old process's side of a service's state stream (see the module docs).
pub trait StateExport: Send {
    /// Appends the next part of the stream to `out`, about `bytes_max` bytes (a record larger
    /// than that may be cut anywhere: the stream is a byte stream, chunk boundaries carry no
    /// meaning). Returns `Ok(false)` once everything was produced (`out` may still have
    /// received a last part).
    fn next_chunk(&mut self, out: &mut Vec<u8>, bytes_max: usize) -> Result<bool, String>;

    /// What was exported, for the takeover report ("412,331 items, 1.0 GiB").
    fn summary(&self) -> String;
}

/// The new process's side of a service's state stream (see the module docs).
pub trait StateImport: Send {
    /// Consumes the next part of the stream, in the order [`StateExport::next_chunk`] made
    /// them. An error stops the import: the service must be left as if nothing had been
    /// imported, or with what was imported so far whole (never a half-written record).
    fn chunk(&mut self, data: &[u8]) -> Result<(), String>;

    /// The stream ended: finish (e.g. check that it was complete). Returns what was imported,
    /// for the takeover report, or why nothing was kept (a format version or `--memory-mb`
    /// mismatch: the service starts clean and says so here).
    fn finish(self: Box<Self>) -> Result<String, String>;
}
