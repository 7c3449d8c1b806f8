//! sockperf's TCP message format, sans-IO: the client's requests, the stream decoder, and the
//! rules by which `sockperf server --tcp` answers.
//!
//! # Wire format
//!
//! Read from sockperf 3.x (`src/message.h` `class MsgHeader`, `src/server.h`
//! `Server::server_receive_then_send`, `src/client.h` `Client::client_receive_from_selected`,
//! github.com/Mellanox/sockperf) and checked against Debian's `sockperf` 3.7 binary on loopback
//! (a capture of `sockperf ping-pong --tcp -m 64` and probes of `sockperf server --tcp`; the
//! differential test in `crates/corelocal-cli/tests/e2e_sockperf.rs` replays them). Every
//! message is one 14-byte header followed by its payload, all in network byte order:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | sequence number (`u64`, big-endian; the client counts from 1) |
//! | 8 | 2 | flags (`u16`, big-endian): `1` client, `2` pong request, `4` warm-up |
//! | 10 | 4 | length (`u32`, big-endian): the whole message, header included |
//!
//! (`MsgHeader` is `#pragma pack(2)` with `EFFECTIVE_SIZE = 8 + 2 + 4`; `hton()` swaps each
//! field.) TCP is a byte stream: messages arrive split and coalesced, and the receiver frames
//! them by the length field.
//!
//! `sockperf ping-pong --tcp -m SIZE` sends messages of exactly SIZE bytes (at least 14; a
//! server takes at most 65,507) with flags `client | pong request` (3), sequence numbers 1, 2,
//! 3, … one at a time, each after the previous reply arrived; the payload is a fixed buffer.
//! No warm-up messages are sent on TCP (the capture shows only flags 3).
//!
//! `sockperf server --tcp` takes each whole message and:
//!
//! - closes the connection if the length exceeds its maximum (`-m`, default 65,507 =
//!   `MAX_PAYLOAD_SIZE`; it logs "Message received was larger than expected");
//! - ignores it unless the client flag is set (a server's own message looped back);
//! - ignores it if the warm-up flag is set;
//! - otherwise counts it, and if the pong-request flag is set answers the same bytes (same
//!   sequence number, length and payload) with the client flag cleared and every other flag
//!   bit kept (flags 3 → 2, 0x13 → 0x12).
//!
//! sockperf 3.7 has one quirk not copied here: after a message it ignores (no client flag, or
//! warm-up) its receive loop returns early and drops whatever else that `recv()` returned, so
//! messages coalesced behind an ignored one are lost and the stream loses its framing. Here
//! framing goes on and those messages are taken by the same rules.
//!
//! A length below 14 is undefined in sockperf (3.7 closes the connection, echoes garbage or
//! stalls depending on the value); here it is malformed: [`FrameError::TooShort`].
//!
//! The client takes replies the same way: it skips messages with the client flag or the
//! warm-up flag, and fails on a sequence number above the last one it sent or a length above
//! the maximum.

use std::fmt;

/// Bytes of the header.
pub const HEADER_LEN: usize = 14;

/// sockperf's largest TCP message (`MAX_PAYLOAD_SIZE`, the default of `sockperf server -m`),
/// header included.
pub const MAX_MESSAGE_LEN: usize = 65_507;

/// Flag: sent by a client.
pub const FLAG_CLIENT: u16 = 1;
/// Flag: the client wants this message answered.
pub const FLAG_PONG_REQUEST: u16 = 2;
/// Flag: a warm-up message (never answered, never counted).
pub const FLAG_WARMUP: u16 = 4;

/// A message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Sequence number.
    pub seq: u64,
    /// Flag bits ([`FLAG_CLIENT`], [`FLAG_PONG_REQUEST`], [`FLAG_WARMUP`], others kept as is).
    pub flags: u16,
    /// Length of the whole message, header included.
    pub len: u32,
}

impl Header {
    /// The 14 wire bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(&self.seq.to_be_bytes());
        b[8..10].copy_from_slice(&self.flags.to_be_bytes());
        b[10..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Reads a header from its 14 wire bytes.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Header {
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[..8]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&b[10..]);
        Header {
            seq: u64::from_be_bytes(seq),
            flags: u16::from_be_bytes([b[8], b[9]]),
            len: u32::from_be_bytes(len),
        }
    }

    /// Sent by a client.
    pub fn is_client(&self) -> bool {
        self.flags & FLAG_CLIENT != 0
    }

    /// A warm-up message.
    pub fn is_warmup(&self) -> bool {
        self.flags & FLAG_WARMUP != 0
    }

    /// Asks for an answer.
    pub fn wants_pong(&self) -> bool {
        self.flags & FLAG_PONG_REQUEST != 0
    }

    /// Whether `sockperf server` answers this message (client, not warm-up, pong requested).
    pub fn server_answers(&self) -> bool {
        self.is_client() && !self.is_warmup() && self.wants_pong()
    }

    /// The header of the server's answer: the client flag cleared, the rest unchanged.
    pub fn reply(&self) -> Header {
        Header {
            flags: self.flags & !FLAG_CLIENT,
            ..*self
        }
    }

    /// Checks the length against `[HEADER_LEN, max_len]`.
    pub fn check_len(&self, max_len: usize) -> Result<usize, FrameError> {
        let len = self.len as usize;
        if len < HEADER_LEN {
            return Err(FrameError::TooShort(self.len));
        }
        if len > max_len {
            return Err(FrameError::TooLong {
                len: self.len,
                max: max_len,
            });
        }
        Ok(len)
    }
}

/// A message that cannot be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The length field is below the header size.
    TooShort(u32),
    /// The length field exceeds the limit.
    TooLong {
        /// The length field.
        len: u32,
        /// The limit.
        max: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooShort(len) => {
                write!(
                    f,
                    "sockperf message length {len} is below the {HEADER_LEN}-byte header"
                )
            }
            FrameError::TooLong { len, max } => {
                write!(f, "sockperf message length {len} exceeds the limit {max}")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Clamps a message-size limit to what sockperf allows (`HEADER_LEN..=MAX_MESSAGE_LEN`).
pub fn clamp_max_len(max_len: usize) -> usize {
    max_len.clamp(HEADER_LEN, MAX_MESSAGE_LEN)
}

/// Appends a client request of `len` bytes in total (header included; clamped to
/// `HEADER_LEN..=MAX_MESSAGE_LEN`): sequence number `seq`, flags `client | pong request`
/// (or `client` alone when `pong` is false), a repeating `a..z` payload.
pub fn encode_request(seq: u64, len: usize, pong: bool, out: &mut Vec<u8>) {
    let len = clamp_max_len(len);
    let flags = FLAG_CLIENT | if pong { FLAG_PONG_REQUEST } else { 0 };
    let header = Header {
        seq,
        flags,
        len: len as u32,
    };
    out.extend_from_slice(&header.encode());
    out.extend((0..len - HEADER_LEN).map(|i| b'a' + (i % 26) as u8));
}

/// The header at the front of `input` if a whole message is there: `Ok(None)` means more
/// bytes are needed (a header or a payload is incomplete).
pub fn peek(input: &[u8], max_len: usize) -> Result<Option<Header>, FrameError> {
    let Some(head) = input.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let header = Header::decode(head);
    let len = header.check_len(max_len)?;
    Ok((input.len() >= len).then_some(header))
}

/// What one decoder step produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// Every byte was consumed; the message is not complete yet.
    NeedMore,
    /// A message ended after `consumed` bytes of this input.
    Message {
        /// Its header.
        header: Header,
        /// Bytes of this input that belonged to it.
        consumed: usize,
    },
}

/// Incremental stream decoder: frames messages from chunks of any size, keeping at most the
/// 14 header bytes (payload bytes are counted, not stored). After a message it starts on the
/// next one.
#[derive(Debug, Clone)]
pub struct Decoder {
    max_len: usize,
    head: [u8; HEADER_LEN],
    head_got: usize,
    header: Option<Header>,
    body_left: usize,
}

impl Decoder {
    /// A decoder rejecting messages longer than `max_len` (clamped to sockperf's range).
    pub fn new(max_len: usize) -> Decoder {
        Decoder {
            max_len: clamp_max_len(max_len),
            head: [0; HEADER_LEN],
            head_got: 0,
            header: None,
            body_left: 0,
        }
    }

    /// Whether the decoder is between messages (no partial header or payload held).
    pub fn is_idle(&self) -> bool {
        self.head_got == 0 && self.header.is_none()
    }

    /// Feeds bytes; stops at the end of the first message completed.
    pub fn feed(&mut self, data: &[u8]) -> Result<Decoded, FrameError> {
        let mut used = 0;
        if self.header.is_none() {
            let take = (HEADER_LEN - self.head_got).min(data.len());
            self.head[self.head_got..self.head_got + take].copy_from_slice(&data[..take]);
            self.head_got += take;
            used = take;
            if self.head_got < HEADER_LEN {
                return Ok(Decoded::NeedMore);
            }
            let header = Header::decode(&self.head);
            self.body_left = header.check_len(self.max_len)? - HEADER_LEN;
            self.header = Some(header);
        }
        let take = self.body_left.min(data.len() - used);
        self.body_left -= take;
        used += take;
        match self.header {
            Some(header) if self.body_left == 0 => {
                self.header = None;
                self.head_got = 0;
                Ok(Decoded::Message {
                    header,
                    consumed: used,
                })
            }
            _ => Ok(Decoded::NeedMore),
        }
    }
}

/// What [`serve`] did with some input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Served {
    /// Bytes consumed: whole messages only (a partial one stays for the next call).
    pub consumed: usize,
    /// Whole messages taken.
    pub messages: u32,
    /// Messages answered.
    pub replies: u32,
    /// The input broke the framing: close the connection (after flushing the answers).
    pub error: Option<FrameError>,
}

/// The server side (`sockperf server --tcp`): takes every whole message at the front of
/// `input` and appends the answers to `out` (at most `input.len()` bytes). Stateless: the
/// caller keeps unconsumed bytes and calls again with more.
pub fn serve(input: &[u8], max_len: usize, out: &mut Vec<u8>) -> Served {
    let max_len = clamp_max_len(max_len);
    let mut s = Served::default();
    while s.messages < u32::MAX {
        let rest = &input[s.consumed..];
        let header = match peek(rest, max_len) {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                s.error = Some(e);
                break;
            }
        };
        let len = header.len as usize;
        if header.server_answers() {
            out.extend_from_slice(&header.reply().encode());
            out.extend_from_slice(&rest[HEADER_LEN..len]);
            s.replies += 1;
        }
        s.consumed += len;
        s.messages += 1;
    }
    s
}

#[cfg(test)]
mod tests;
