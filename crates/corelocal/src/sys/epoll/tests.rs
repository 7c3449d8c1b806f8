//! Tests of the epoll backend against real sockets: a connection closed at EOF costs one
//! `epoll_ctl`, and the last send takes the close with it.

use super::*;
use std::io::Write;
use std::net::{TcpListener, TcpStream};

/// Waits (bounded) until the backend reports a completion matching `want`.
fn next(b: &mut EpollBackend, want: impl Fn(&Completion) -> bool) -> Completion {
    let mut out = Vec::new();
    for _ in 0..200 {
        b.submit().unwrap();
        b.wait(Some(Duration::from_millis(10))).unwrap();
        b.reap(&mut out, 64);
        if let Some(i) = out.iter().position(&want) {
            return out.swap_remove(i);
        }
    }
    panic!("no such completion; got {out:?}");
}

/// A backend accepting on a fresh listener, a client connected to it, and its connection.
fn accepted() -> (EpollBackend, TcpListener, TcpStream, ConnId) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut b = EpollBackend::new(PoolConfig {
        bufs: 4,
        buf_bytes: 4096,
    })
    .unwrap();
    b.push(Op::Accept {
        listener: 0,
        fd: listener.as_raw_fd(),
        exclusive: false,
        budget: None,
    });
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let Completion::Accepted { conn, .. } =
        next(&mut b, |c| matches!(c, Completion::Accepted { .. }))
    else {
        unreachable!()
    };
    (b, listener, client, conn)
}

/// A one-shot connection (request, then the peer closes, then we close) costs exactly one
/// `epoll_ctl`, its ADD: the interest change at EOF is dropped because the connection
/// closes in the same turn.
#[test]
fn a_connection_closed_at_eof_costs_one_epoll_ctl() {
    // The request and the peer's close are queued before the worker first reads.
    let (mut b, _listener, mut client, conn) = accepted();
    client.write_all(b"ping").unwrap();
    drop(client);
    let before = b.ctl_calls();
    b.push(Op::Recv { conn });
    if let Completion::Recv { buf, .. } = next(&mut b, |c| matches!(c, Completion::Recv { .. })) {
        b.release(buf);
    }
    next(&mut b, |c| matches!(c, Completion::Eof { .. }));
    b.push(Op::Close { conn });
    next(&mut b, |c| matches!(c, Completion::Closed { .. }));
    b.submit().unwrap();
    b.wait(Some(Duration::ZERO)).unwrap();
    assert_eq!(b.ctl_calls() - before, 1, "only the connection's ADD");
}

/// The last answer with its close: `Sent` then `Closed` without an `Op::Close`, and the
/// peer reads the data, then EOF.
#[test]
fn the_last_send_takes_the_close_with_it() {
    use std::io::Read;
    let (mut b, listener, mut client, conn) = accepted();
    b.push(Op::Send {
        conn,
        buf: b"pong".to_vec(),
        close_after: true,
    });
    b.submit().unwrap();
    b.wait(Some(Duration::ZERO)).unwrap();
    let mut out = Vec::new();
    b.reap(&mut out, 64);
    assert!(
        matches!(
            out.as_slice(),
            [
                Completion::Sent { result: Ok(4), .. },
                Completion::Closed { .. }
            ]
        ),
        "{out:?}"
    );
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, b"pong");
    // Aborting touches only a connection whose last send still waits: after the close the
    // fd number may belong to a new connection (no last send of its own) — left alone.
    b.push(Op::AbortSend { conn });
    let mut second = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let Completion::Accepted { conn: new_conn, .. } =
        next(&mut b, |c| matches!(c, Completion::Accepted { .. }))
    else {
        unreachable!()
    };
    b.push(Op::AbortSend { conn: new_conn });
    b.push(Op::Recv { conn: new_conn });
    second.write_all(b"still open").unwrap();
    let Completion::Recv { len, .. } = next(&mut b, |c| matches!(c, Completion::Recv { .. }))
    else {
        unreachable!()
    };
    assert_eq!(len, 10);
}

/// The peer sent more after its request before the worker answered: the last send still
/// reaches it, then the end of the stream (the sending side is shut down before the close,
/// whose reset for the unread input then comes after the answer and its FIN).
#[test]
fn the_last_send_survives_input_sent_after_the_request() {
    use std::io::Read;
    let (mut b, _listener, mut client, conn) = accepted();
    client.write_all(&[b'p'; 3000]).unwrap();
    std::thread::sleep(Duration::from_millis(20)); // queued, unread, at the server's socket
    b.push(Op::Send {
        conn,
        buf: b"pong".to_vec(),
        close_after: true,
    });
    next(&mut b, |c| matches!(c, Completion::Closed { .. }));
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, b"pong");
}

/// `Accepted` completions over `turns` turns.
fn accepted_in(b: &mut EpollBackend, turns: usize) -> usize {
    let mut out = Vec::new();
    for _ in 0..turns {
        b.submit().unwrap();
        b.wait(Some(Duration::from_millis(10))).unwrap();
        b.reap(&mut out, 64);
    }
    out.iter()
        .filter(|c| matches!(c, Completion::Accepted { .. }))
        .count()
}

/// A budget is exact (the accept policy): of five queued connections `Some(2)` takes two,
/// `Some(0)` nothing more, `Some(1)` one, and `None` the rest; a pause settles.
#[test]
fn a_budget_accepts_exactly_as_many_as_allowed() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let _clients: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let fd = listener.as_raw_fd();
    let accept = |budget| Op::Accept {
        listener: 0,
        fd,
        exclusive: false,
        budget,
    };
    let mut b = EpollBackend::new(PoolConfig {
        bufs: 4,
        buf_bytes: 4096,
    })
    .unwrap();
    b.push(accept(Some(2)));
    assert_eq!(accepted_in(&mut b, 10), 2);
    b.push(accept(Some(0)));
    assert_eq!(accepted_in(&mut b, 5), 0);
    b.push(accept(Some(1)));
    assert_eq!(accepted_in(&mut b, 10), 1);
    b.push(accept(None));
    assert_eq!(accepted_in(&mut b, 10), 2);
    b.push(Op::AcceptPause { listener: 0, fd });
    accepted_in(&mut b, 2);
    assert!(b.accepts_settled());
}
