//! The TCP transport's threads, each owning its socket: one acceptor for the data listener,
//! one reader per incoming connection, one writer per peer this rank sends to. They report
//! to the owner of the transport ([`super::core::Core`]) through one channel of [`Event`]s,
//! so the owner never blocks on a socket: a peer that stops reading stalls only its writer,
//! and an abort or a shutdown closes sockets instead of waiting on them.
//!
//! Connections are one-way and made on first use: rank a's messages to b go over the
//! connection a opened to b, in order, so messages of one pair and tag arrive in the order
//! they were posted, and a rank connects only to the peers it has data for.

use std::collections::HashMap;
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::{self, HEADER};
use crate::sys::sync::Locked;

/// What the threads tell the owner.
pub(super) enum Event {
    /// World rank `from` connected.
    Joined { from: u32 },
    /// A whole message from world rank `from`, the `seq`-th on its connection.
    Arrived {
        from: u32,
        seq: u64,
        ctx: u64,
        tag: u16,
        data: Vec<u8>,
    },
    /// A send was written to its socket, the `seq`-th on it; its buffer, for reuse.
    Sent { ticket: u64, seq: u64, buf: Vec<u8> },
    /// A connection to or from world rank `peer` ended (`why`, a sentence).
    Gone { peer: u32, why: String, how: Ended },
    /// An incoming connection was refused (a stray or another job's).
    Stranger(String),
}

/// How a connection with a peer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// Its incoming connection ended (after every byte it sent was read).
    Reader,
    /// Writing to it failed.
    Writer,
    /// An idle outgoing connection was closed by the peer: gone once its incoming one has
    /// ended too (what it sent may still be on the way).
    Closed,
    /// Its host never answered (a firewall?).
    Unreachable,
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

/// The streams the readers hold, by an id each, to close on shutdown (a reader that ends
/// takes its own out).
type Streams = Arc<Mutex<HashMap<u64, TcpStream>>>;

/// Who the readers serve: the job's token, this rank and the world's size (a hello must
/// name another rank of it).
#[derive(Clone, Copy)]
pub(super) struct Local {
    pub token: u64,
    pub me: u32,
    pub world: u32,
}

/// The incoming side: the acceptor and the streams its readers hold, to close on shutdown.
pub(super) struct Incoming {
    stop: Arc<AtomicBool>,
    streams: Streams,
    acceptor: Option<JoinHandle<()>>,
}

impl Incoming {
    /// Starts accepting on `listener`: each connection that presents the token gets a reader.
    pub fn start(listener: TcpListener, local: Local, events: Sender<Event>) -> Incoming {
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Streams::default();
        let (s, held) = (stop.clone(), streams.clone());
        let acceptor = std::thread::Builder::new()
            .name("tcp-accept".into())
            .spawn(move || accept(listener, local, events, &s, &held))
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
        for s in self.streams.locked().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn accept(
    listener: TcpListener,
    local: Local,
    events: Sender<Event>,
    stop: &AtomicBool,
    streams: &Streams,
) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let mut next_id = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, addr)) => {
                next_id += 1;
                let (id, events, held) = (next_id, events.clone(), streams.clone());
                if let Ok(kept) = stream.try_clone() {
                    streams.locked().insert(id, kept);
                }
                let reader = Reader {
                    addr,
                    local,
                    events,
                };
                let spawned =
                    std::thread::Builder::new()
                        .name("tcp-read".into())
                        .spawn(move || {
                            reader.run(stream);
                            held.locked().remove(&id);
                        });
                if spawned.is_err() {
                    streams.locked().remove(&id);
                }
            }
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
}

/// One incoming connection's reader.
struct Reader {
    addr: SocketAddr,
    local: Local,
    events: Sender<Event>,
}

impl Reader {
    /// Its hello, then messages until it ends.
    fn run(self, stream: TcpStream) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(HELLO_WITHIN));
        keep_alive(&stream);
        let mut r = std::io::BufReader::with_capacity(1 << 16, stream);
        let Local { token, me, world } = self.local;
        let from = match wire::read_data_hello(&mut r, token) {
            Ok(f) if f < world && f != me => f,
            Ok(f) => return self.stranger(format!("a data connection saying it is rank {f}")),
            Err(e) => return self.stranger(e.to_string()),
        };
        let _ = r.get_ref().set_read_timeout(None);
        if self.events.send(Event::Joined { from }).is_err() {
            return;
        }
        let mut seq = 0u64;
        let why = loop {
            match read_message(&mut r) {
                Ok(Some((ctx, tag, data))) => {
                    let arrived = Event::Arrived {
                        from,
                        seq,
                        ctx,
                        tag,
                        data,
                    };
                    seq += 1;
                    if self.events.send(arrived).is_err() {
                        return;
                    }
                }
                Ok(None) => break "closed its connection".to_string(),
                Err(why) => break why,
            }
        };
        let _ = self.events.send(Event::Gone {
            peer: from,
            why,
            how: Ended::Reader,
        });
    }

    fn stranger(&self, why: String) {
        let _ = self
            .events
            .send(Event::Stranger(format!("{}: {why}", self.addr)));
    }
}

/// The next message, `None` at a clean end of the stream, or why the stream broke.
fn read_message(r: &mut impl Read) -> Result<Option<(u64, u16, Vec<u8>)>, String> {
    let mut h = [0u8; HEADER];
    if let Err(e) = r.read_exact(&mut h) {
        return match e.kind() {
            ErrorKind::UnexpectedEof => Ok(None),
            _ => Err(format!("its connection failed: {e}")),
        };
    }
    let (ctx, tag, len) =
        wire::parse_header(&h).map_err(|e| format!("sent a bad message header: {e}"))?;
    // Read into spare capacity: no zeroing of a buffer the socket fills anyway; a length
    // this process cannot hold is an error, not an abort.
    let mut data = Vec::new();
    (data.try_reserve_exact(len as usize)).map_err(|_| {
        format!("announced a message of {len} bytes, more than this process can hold")
    })?;
    match r.take(len).read_to_end(&mut data) {
        Ok(n) if n as u64 == len => Ok(Some((ctx, tag, data))),
        Ok(n) => Err(format!(
            "its connection ended inside a message ({n} of {len} bytes)"
        )),
        Err(e) => Err(format!("its connection ended inside a message: {e}")),
    }
}

/// TCP keep-alive probes after 10 s idle, every 5 s, 3 of them, and a 60 s limit on
/// unacknowledged sends: a peer whose host died (no FIN, no RST) is noticed within about a
/// minute instead of never.
fn keep_alive(s: &TcpStream) {
    let fd = s.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: `fd` is an open socket for the duration of the call, and `value` lives on
        // the stack with the size we pass.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 60_000);
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
        Err((why, how)) => {
            let _ = events.send(Event::Gone {
                peer: route.peer,
                why,
                how,
            });
            return;
        }
    };
    let mut w = BufWriter::with_capacity(1 << 16, stream);
    let mut seq = 0u64;
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
            seq,
            buf: out.buf,
        };
        seq += 1;
        if events.send(sent).is_err() {
            break w.flush().err();
        }
    };
    if let Some(e) = failed {
        let (why, how) = match e.kind() {
            ErrorKind::UnexpectedEof => ("closed its connection".to_string(), Ended::Closed),
            _ => (
                format!("writing to it at {} failed: {e}", route.addr),
                Ended::Writer,
            ),
        };
        let _ = events.send(Event::Gone {
            peer: route.peer,
            why,
            how,
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
/// [`CONNECT_FOR`]); refused: why, and how ([`Ended::Unreachable`] when its host never
/// answered, rather than answered that nothing listens).
fn connect(route: &Route) -> Result<TcpStream, (String, Ended)> {
    // Every listener is bound before the rendezvous answers: a refusal means the peer's
    // daemon ended, no retry.
    let last = TcpStream::connect_timeout(&route.addr, CONNECT_FOR);
    let addr = route.addr;
    let unreachable = |e: std::io::Error| match e.kind() {
        ErrorKind::ConnectionRefused => (
            format!(
                "nothing listens at {addr} any more (its daemon ended, or a firewall rejects the port)"
            ),
            Ended::Writer,
        ),
        _ => (
            format!(
                "it cannot be reached at {addr} ({e}): a firewall between the hosts? Every pair of \
                 hosts must allow TCP to the ports ranks listen on (SHUFFLEFS_DATA_PORT fixes \
                 them: that port plus each rank's LOCAL_RANK)"
            ),
            Ended::Unreachable,
        ),
    };
    let mut s = last.map_err(unreachable)?;
    let _ = s.set_nodelay(true);
    keep_alive(&s);
    let hello = wire::data_hello(route.token, route.me);
    (s.write_all(&hello)).map_err(|e| {
        (
            format!("it closed the connection at {addr} at once: {e}"),
            Ended::Writer,
        )
    })?;
    Ok(s)
}
