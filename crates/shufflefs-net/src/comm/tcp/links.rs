//! The TCP transport's threads, each owning its socket: one acceptor for the data listener,
//! one reader per incoming connection, one writer per peer this rank sends to. They report
//! to the owner of the transport ([`super::core::Core`]) through one channel of [`Event`]s,
//! so the owner never blocks on a socket: a peer that stops reading stalls only its writer,
//! and an abort or a shutdown closes sockets instead of waiting on them.
//!
//! Connections are one-way and made on first use: rank a's messages to b go over the
//! connection a opened to b, in order, so messages of one pair and tag arrive in the order
//! they were posted, and a rank connects only to the peers it has data for.

use std::io::{BufWriter, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::{self, HEADER};

/// What the threads tell the owner.
pub(super) enum Event {
    /// A whole message from world rank `from`.
    Arrived {
        from: u32,
        ctx: u64,
        tag: u16,
        data: Vec<u8>,
    },
    /// A send was written to its socket; its buffer, for reuse.
    Sent { ticket: u64, buf: Vec<u8> },
    /// The connection to or from world rank `peer` ended (`why`, a sentence), or could
    /// not be made at all (`unreachable`).
    Gone {
        peer: u32,
        why: String,
        unreachable: bool,
    },
    /// An incoming connection was refused (a stray or another job's).
    Stranger(String),
}

/// A message for a writer.
pub(super) struct Outgoing {
    pub ctx: u64,
    pub tag: u16,
    pub ticket: u64,
    pub buf: Vec<u8>,
}

/// How long a writer waits for its peer's host to answer before it names it unreachable.
pub(super) const CONNECT_FOR: Duration = Duration::from_secs(30);
/// How long an incoming connection may take to say who it is.
const HELLO_WITHIN: Duration = Duration::from_secs(10);
/// How often an idle writer looks whether its peer closed the connection (which is how a
/// rank learns that a peer it waits on is gone).
const WATCH: Duration = Duration::from_millis(200);
/// How often the acceptor looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// The incoming side: the acceptor and the streams its readers hold, to close on shutdown.
pub(super) struct Incoming {
    stop: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Incoming {
    /// Starts accepting on `listener`: each connection that presents `token` gets a reader.
    pub fn start(listener: TcpListener, token: u64, events: Sender<Event>) -> Incoming {
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let (s, held) = (stop.clone(), streams.clone());
        let acceptor = std::thread::Builder::new()
            .name("tcp-accept".into())
            .spawn(move || accept(listener, token, events, &s, &held))
            .expect("spawn the acceptor");
        Incoming {
            stop,
            streams,
            acceptor: Some(acceptor),
        }
    }

    /// Stops accepting and closes every incoming connection (their readers end).
    pub fn close(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for s in self
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn accept(
    listener: TcpListener,
    token: u64,
    events: Sender<Event>,
    stop: &AtomicBool,
    streams: &Mutex<Vec<TcpStream>>,
) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, addr)) => {
                let (events, kept) = (events.clone(), stream.try_clone());
                if let Ok(kept) = kept {
                    streams.lock().unwrap_or_else(|e| e.into_inner()).push(kept);
                }
                let _ = std::thread::Builder::new()
                    .name("tcp-read".into())
                    .spawn(move || read(stream, addr, token, events));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
}

/// One incoming connection: its hello, then messages until it ends.
fn read(stream: TcpStream, addr: SocketAddr, token: u64, events: Sender<Event>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(HELLO_WITHIN));
    let mut r = std::io::BufReader::with_capacity(1 << 16, stream);
    let from = match wire::read_data_hello(&mut r, token) {
        Ok(f) => f,
        Err(e) => {
            let _ = events.send(Event::Stranger(format!("{addr}: {e}")));
            return;
        }
    };
    let _ = r.get_ref().set_read_timeout(None);
    let why = loop {
        let mut h = [0u8; HEADER];
        if let Err(e) = r.read_exact(&mut h) {
            break match e.kind() {
                ErrorKind::UnexpectedEof => "closed its connection".to_string(),
                _ => format!("its connection failed: {e}"),
            };
        }
        let (ctx, tag, len) = match wire::parse_header(&h) {
            Ok(v) => v,
            Err(e) => break format!("sent a bad message header: {e}"),
        };
        // Read into spare capacity: no zeroing of a buffer the socket fills anyway.
        let mut data = Vec::with_capacity(len as usize);
        match (&mut r).take(len).read_to_end(&mut data) {
            Ok(n) if n as u64 == len => {}
            Ok(n) => break format!("its connection ended inside a message ({n} of {len} bytes)"),
            Err(e) => break format!("its connection ended inside a message: {e}"),
        }
        let arrived = Event::Arrived {
            from,
            ctx,
            tag,
            data,
        };
        if events.send(arrived).is_err() {
            return;
        }
    };
    let unreachable = false;
    let _ = events.send(Event::Gone {
        peer: from,
        why,
        unreachable,
    });
}

/// The outgoing side of one peer: a queue and the thread that writes it.
pub(super) struct Writer {
    queue: Option<Sender<Outgoing>>,
    thread: Option<JoinHandle<()>>,
}

/// Who a writer is and whom it writes to.
pub(super) struct Route {
    pub me: u32,
    pub peer: u32,
    pub addr: SocketAddr,
    pub token: u64,
}

impl Writer {
    pub fn start(route: Route, events: Sender<Event>) -> Writer {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("tcp-write".into())
            .spawn(move || write(route, rx, events))
            .expect("spawn a writer");
        Writer {
            queue: Some(tx),
            thread: Some(thread),
        }
    }

    /// Queues `out`; false if the writer has ended (its peer is gone).
    pub fn push(&self, out: Outgoing) -> bool {
        self.queue.as_ref().is_some_and(|q| q.send(out).is_ok())
    }

    /// Lets the writer finish what is queued and waits for it, at most `within`.
    pub fn finish(&mut self, within: Duration) {
        self.queue = None;
        let Some(t) = self.thread.take() else { return };
        let until = Instant::now() + within;
        while !t.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}

fn write(route: Route, queue: Receiver<Outgoing>, events: Sender<Event>) {
    let stream = match connect(&route) {
        Ok(s) => s,
        Err((why, unreachable)) => {
            let peer = route.peer;
            let _ = events.send(Event::Gone {
                peer,
                why,
                unreachable,
            });
            return;
        }
    };
    let mut w = BufWriter::with_capacity(1 << 16, stream);
    let failed = loop {
        let out = match queue.try_recv() {
            Ok(out) => out,
            Err(TryRecvError::Empty) => match w.flush().map(|()| queue.recv_timeout(WATCH)) {
                Ok(Ok(out)) => out,
                Ok(Err(RecvTimeoutError::Timeout)) => match closed(w.get_ref()) {
                    true => break Some(ErrorKind::UnexpectedEof.into()),
                    false => continue,
                },
                Ok(Err(RecvTimeoutError::Disconnected)) => break None,
                Err(e) => break Some(e),
            },
            Err(TryRecvError::Disconnected) => break w.flush().err(),
        };
        let head = wire::header(out.ctx, out.tag, out.buf.len() as u64);
        if let Err(e) = w.write_all(&head).and_then(|()| w.write_all(&out.buf)) {
            break Some(e);
        }
        let sent = Event::Sent {
            ticket: out.ticket,
            buf: out.buf,
        };
        if events.send(sent).is_err() {
            break w.flush().err();
        }
    };
    if let Some(e) = failed {
        let why = match e.kind() {
            ErrorKind::UnexpectedEof => "closed its connection".to_string(),
            _ => format!("writing to it at {} failed: {e}", route.addr),
        };
        let (peer, unreachable) = (route.peer, false);
        let _ = events.send(Event::Gone {
            peer,
            why,
            unreachable,
        });
    }
    if let Ok(s) = w.into_inner() {
        let _ = s.shutdown(Shutdown::Write);
    }
}

/// Whether the peer closed `s` (it never writes on it: anything readable is its end).
fn closed(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return true;
    }
    let gone = match s.peek(&mut [0u8; 1]) {
        Ok(_) => true,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    gone || s.set_nonblocking(false).is_err()
}

/// A connection to `route`'s peer that has said who we are (a silent host is given
/// [`CONNECT_FOR`]).
/// Refused: why, and whether the peer's host could not be reached at all (no answer) rather
/// than answered that nothing listens.
fn connect(route: &Route) -> Result<TcpStream, (String, bool)> {
    // Every listener is bound before the rendezvous answers: a refusal means the peer's
    // daemon ended, no retry.
    let last = TcpStream::connect_timeout(&route.addr, CONNECT_FOR);
    let unreachable = |e: std::io::Error| {
        if e.kind() == ErrorKind::ConnectionRefused {
            return (
                format!(
                    "nothing listens at {} any more (its daemon ended?)",
                    route.addr
                ),
                false,
            );
        }
        let why = format!(
            "it cannot be reached at {} ({e}): a firewall between the hosts? Every pair of \
             hosts must allow TCP to the ports ranks listen on (SHUFFLEFS_DATA_PORT fixes it)",
            route.addr
        );
        (why, true)
    };
    let mut s = last.map_err(unreachable)?;
    let _ = s.set_nodelay(true);
    (s.write_all(&wire::data_hello(route.token, route.me))).map_err(|e| {
        (
            format!("it closed the connection at {} at once: {e}", route.addr),
            false,
        )
    })?;
    Ok(s)
}
