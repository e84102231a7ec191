//! The state every communicator of one TCP transport shares (the world and what `split`
//! made of it): the links, and the matching of messages to posted receives. Owned by the one
//! thread that owns the transport (as MPI's is), behind an `Rc<RefCell<_>>`.
//!
//! Matching is MPI's: a message is matched by (communicator, sender, tag) to the oldest
//! receive posted for it; a message that arrives first waits for its receive (an eager
//! send: a send completes once it is written to its socket, whether or not the peer posted
//! the receive). Ranks are world ranks here; a communicator maps its own.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use super::links::{Event, Incoming, Outgoing, Route, Writer};
use crate::comm::{CommError, Done, Ticket};

/// (communicator, world rank of the peer, tag).
type Key = (u64, u32, u16);

/// How long a closing transport waits for its writers to drain.
const DRAIN_FOR: Duration = Duration::from_secs(30);

/// A receive waiting for its message.
struct Posted {
    ticket: Ticket,
    len: usize,
}

pub(super) struct Core {
    pub me: u32,
    /// Every world rank's data address and host name.
    pub peers: Vec<(SocketAddr, String)>,
    token: u64,
    events: Receiver<Event>,
    sender: Sender<Event>,
    incoming: Incoming,
    writers: HashMap<u32, Writer>,
    /// Messages that came before their receive.
    arrived: HashMap<Key, VecDeque<Vec<u8>>>,
    posted: HashMap<Key, VecDeque<Posted>>,
    /// Sends written or queued, by ticket: their communicator and peer.
    sending: HashMap<Ticket, (u64, u32)>,
    /// Completions not handed out yet, per communicator.
    ready: HashMap<u64, Vec<Done>>,
    /// Errors for a communicator's next `progress` (a message of the wrong length).
    failed: HashMap<u64, CommError>,
    detached: HashSet<Ticket>,
    /// Peers whose connection ended, how, and whether they could not be reached at all.
    gone: HashMap<u32, (String, bool)>,
    next_ticket: Ticket,
}

impl Core {
    /// The transport of world rank `me`, whose data listener is `listener`.
    pub fn new(
        me: u32,
        listener: TcpListener,
        token: u64,
        peers: Vec<(SocketAddr, String)>,
    ) -> Core {
        let (sender, events) = channel();
        let incoming = Incoming::start(listener, token, sender.clone());
        Core {
            me,
            peers,
            token,
            events,
            sender,
            incoming,
            writers: HashMap::new(),
            arrived: HashMap::new(),
            posted: HashMap::new(),
            sending: HashMap::new(),
            ready: HashMap::new(),
            failed: HashMap::new(),
            detached: HashSet::new(),
            gone: HashMap::new(),
            next_ticket: 0,
        }
    }

    fn ticket(&mut self) -> Ticket {
        self.next_ticket += 1;
        self.next_ticket
    }

    /// Queues `buf` for world rank `to`.
    pub fn send(&mut self, ctx: u64, to: u32, tag: u16, buf: Vec<u8>) -> Result<Ticket, CommError> {
        let ticket = self.ticket();
        if to == self.me {
            let (from, sender) = (self.me, &self.sender);
            let _ = sender.send(Event::Arrived {
                from,
                ctx,
                tag,
                data: buf,
            });
            let done = Done {
                ticket,
                buf: Vec::new(),
            };
            self.ready.entry(ctx).or_default().push(done);
            return Ok(ticket);
        }
        if self.gone.contains_key(&to) {
            return Err(self.gone_error(to));
        }
        let writer = self.writer(to);
        let out = Outgoing {
            ctx,
            tag,
            ticket,
            buf,
        };
        if !writer.push(out) {
            return Err(CommError::PeerGone(to));
        }
        self.sending.insert(ticket, (ctx, to));
        Ok(ticket)
    }

    /// Makes sure a connection to `peer` exists, so that its end is noticed while this rank
    /// waits on it (a writer watches its idle connection).
    fn watch(&mut self, peer: u32) {
        if peer != self.me {
            self.writer(peer);
        }
    }

    fn writer(&mut self, to: u32) -> &Writer {
        let (me, token, addr) = (self.me, self.token, self.peers[to as usize].0);
        let sender = &self.sender;
        self.writers.entry(to).or_insert_with(|| {
            let route = Route {
                me,
                peer: to,
                addr,
                token,
            };
            Writer::start(route, sender.clone())
        })
    }

    /// Posts a receive of exactly `len` bytes from world rank `from`.
    pub fn recv(&mut self, ctx: u64, from: u32, tag: u16, len: usize) -> Ticket {
        let ticket = self.ticket();
        self.watch(from);
        let key = (ctx, from, tag);
        match self.arrived.get_mut(&key).and_then(VecDeque::pop_front) {
            Some(data) => self.complete(ctx, from, Posted { ticket, len }, data),
            None => self
                .posted
                .entry(key)
                .or_default()
                .push_back(Posted { ticket, len }),
        }
        ticket
    }

    fn complete(&mut self, ctx: u64, from: u32, posted: Posted, data: Vec<u8>) {
        if self.detached.remove(&posted.ticket) {
            return;
        }
        if data.len() != posted.len {
            let e = CommError::Length {
                from,
                expected: posted.len,
                got: data.len(),
            };
            self.failed.entry(ctx).or_insert(e);
            return;
        }
        let done = Done {
            ticket: posted.ticket,
            buf: data,
        };
        self.ready.entry(ctx).or_default().push(done);
    }

    /// Takes the next message of `(ctx, from, tag)` whatever its length, waiting for it
    /// (what collectives use: no receive is posted on their tag).
    pub fn take(&mut self, ctx: u64, from: u32, tag: u16) -> Result<Vec<u8>, CommError> {
        self.watch(from);
        let key = (ctx, from, tag);
        loop {
            if let Some(data) = self.arrived.get_mut(&key).and_then(VecDeque::pop_front) {
                return Ok(data);
            }
            if self.gone.contains_key(&from) {
                return Err(self.gone_error(from));
            }
            self.pump(Duration::from_millis(20));
        }
    }

    /// Waits up to `wait` for one event, then handles every event already there.
    pub fn pump(&mut self, wait: Duration) {
        let first = match self.events.recv_timeout(wait) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
        };
        self.handle(first);
        while let Ok(e) = self.events.try_recv() {
            self.handle(e);
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Arrived {
                from,
                ctx,
                tag,
                data,
            } => {
                let key = (ctx, from, tag);
                match self.posted.get_mut(&key).and_then(VecDeque::pop_front) {
                    Some(p) => self.complete(ctx, from, p, data),
                    None => self.arrived.entry(key).or_default().push_back(data),
                }
            }
            Event::Sent { ticket, buf } => {
                let Some((ctx, _)) = self.sending.remove(&ticket) else {
                    return;
                };
                if !self.detached.remove(&ticket) {
                    self.ready
                        .entry(ctx)
                        .or_default()
                        .push(Done { ticket, buf });
                }
            }
            Event::Gone {
                peer,
                why,
                unreachable,
            } => {
                tracing::debug!("rank {peer}: {why}");
                self.gone.entry(peer).or_insert((why, unreachable));
            }
            Event::Stranger(what) => tracing::warn!("refused a connection from {what}"),
        }
    }

    /// Completions of `ctx` so far, or why it cannot go on: a message of the wrong length,
    /// or a peer gone while this communicator still waits on it (named with the reason).
    pub fn completed(&mut self, ctx: u64) -> Result<Vec<Done>, CommError> {
        if let Some(e) = self.failed.remove(&ctx) {
            return Err(e);
        }
        if let Some(peer) = self.stalled(ctx) {
            return Err(self.gone_error(peer));
        }
        Ok(self.ready.remove(&ctx).unwrap_or_default())
    }

    /// A gone peer that `ctx` still waits on (a receive from it, or a send to it).
    fn stalled(&self, ctx: u64) -> Option<u32> {
        let waits_on = |peer: u32| {
            let recv = (self.posted.iter()).any(|((c, p, _), q)| {
                *c == ctx && *p == peer && q.iter().any(|r| !self.detached.contains(&r.ticket))
            });
            let send = (self.sending.iter())
                .any(|(t, (c, p))| *c == ctx && *p == peer && !self.detached.contains(t));
            recv || send
        };
        self.gone.keys().copied().find(|&p| waits_on(p))
    }

    /// The error for world rank `peer`, whose connection ended: [`CommError::PeerGone`],
    /// or, if it could never be reached, [`CommError::Tcp`] naming its address and the fix.
    pub fn gone_error(&self, peer: u32) -> CommError {
        match self.gone.get(&peer) {
            Some((why, true)) => CommError::Tcp(format!("rank {peer}: {why}")),
            _ => CommError::PeerGone(peer),
        }
    }

    /// Stops caring about `tickets` (see `Comm::detach`).
    pub fn detach(&mut self, ctx: u64, tickets: &[Ticket]) {
        if let Some(ready) = self.ready.get_mut(&ctx) {
            ready.retain(|d| !tickets.contains(&d.ticket));
        }
        let pending = |t: &Ticket| {
            self.sending.contains_key(t)
                || (self.posted.values()).any(|q| q.iter().any(|p| p.ticket == *t))
        };
        let pending: Vec<Ticket> = tickets.iter().copied().filter(pending).collect();
        self.detached.extend(pending);
    }

    /// Withdraws posted receives (see `Comm::cancel`); other tickets are detached.
    pub fn cancel(&mut self, ctx: u64, tickets: &[Ticket]) {
        for q in self.posted.values_mut() {
            q.retain(|p| !tickets.contains(&p.ticket));
        }
        self.detach(ctx, tickets);
    }

    /// Detaches everything `ctx` has in flight (a communicator that gave up on its abort
    /// flag): receives still take their messages off the wire, sends still go.
    pub fn abandon(&mut self, ctx: u64) {
        let recvs = (self.posted.iter())
            .filter(|((c, _, _), _)| *c == ctx)
            .flat_map(|(_, q)| q.iter().map(|p| p.ticket));
        let sends = (self.sending.iter())
            .filter(|(_, (c, _))| *c == ctx)
            .map(|(t, _)| *t);
        let all: Vec<Ticket> = recvs.chain(sends).collect();
        self.detached.extend(all);
        self.ready.remove(&ctx);
    }
}

impl Drop for Core {
    /// Lets the writers drain (as MPI's finalize completes sends), then closes everything.
    fn drop(&mut self) {
        let until = Instant::now() + DRAIN_FOR;
        for w in self.writers.values_mut() {
            w.finish(until.saturating_duration_since(Instant::now()));
        }
        self.incoming.close();
    }
}
