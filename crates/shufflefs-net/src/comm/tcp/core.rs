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

use super::links::{Ended, Event, Incoming, Local, Outgoing, Route, Writer};
use crate::comm::{CommError, Done, Ticket};

/// (communicator, world rank of the peer, tag).
type Key = (u64, u32, u16);

/// Tag reserved for collectives (point-to-point tags are below it).
pub(super) const COLLECTIVE: u16 = u16::MAX;
/// The context of acknowledgements (no communicator has it: see `child_context`).
const ACK_CTX: u64 = u64::MAX;
/// Point-to-point messages up to this length complete once written (MPI's eager protocol);
/// longer ones once their receiver has taken them off the wire, which it acknowledges
/// (MPI's rendezvous: a sender's posted sends then bound what waits at its receiver, as the
/// exchange's frame budget expects).
const EAGER: usize = 64 << 10;

/// Whether a message of `len` bytes on `tag` completes at its sender only when acknowledged.
fn acknowledged(len: usize, tag: u16) -> bool {
    len > EAGER && tag != COLLECTIVE
}

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
    /// Messages that came before their receive, with their number on their connection.
    arrived: HashMap<Key, VecDeque<(u64, Vec<u8>)>>,
    posted: HashMap<Key, VecDeque<Posted>>,
    /// Sends written or queued, by ticket: their communicator and peer.
    sending: HashMap<Ticket, (u64, u32, bool)>,
    /// Written sends waiting for their receiver's acknowledgement, by (peer, number on the
    /// connection to it): their ticket and buffer.
    awaiting: HashMap<(u32, u64), (Ticket, Vec<u8>)>,
    /// Acknowledgements that came before their send's `Sent` event.
    early_acks: HashSet<(u32, u64)>,
    /// Completions not handed out yet, per communicator.
    ready: HashMap<u64, Vec<Done>>,
    /// Errors for a communicator's next `progress` (a message of the wrong length).
    failed: HashMap<u64, CommError>,
    detached: HashSet<Ticket>,
    /// Peers whose connection ended, why and how.
    gone: HashMap<u32, (String, Ended)>,
    /// Peers whose incoming connection is still open.
    reading: HashSet<u32>,
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
        let world = peers.len() as u32;
        let incoming = Incoming::start(listener, Local { token, me, world }, sender.clone());
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
            awaiting: HashMap::new(),
            early_acks: HashSet::new(),
            ready: HashMap::new(),
            failed: HashMap::new(),
            detached: HashSet::new(),
            gone: HashMap::new(),
            reading: HashSet::new(),
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
                seq: 0,
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
        let acked = acknowledged(buf.len(), tag);
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
        self.sending.insert(ticket, (ctx, to, acked));
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
        match self.pop_arrived(key) {
            Some((seq, data)) => self.complete(key, seq, Posted { ticket, len }, data),
            None => (self.posted.entry(key).or_default()).push_back(Posted { ticket, len }),
        }
        ticket
    }

    /// The oldest message of `key` that came before its receive (dropping the key's entry
    /// once empty, so keys of past epochs do not pile up), with its number.
    fn pop_arrived(&mut self, key: Key) -> Option<(u64, Vec<u8>)> {
        let queue = self.arrived.get_mut(&key)?;
        let data = queue.pop_front();
        if queue.is_empty() {
            self.arrived.remove(&key);
        }
        data
    }

    /// The oldest receive posted for `key`, as [`Core::pop_arrived`] does.
    fn pop_posted(&mut self, key: Key) -> Option<Posted> {
        let queue = self.posted.get_mut(&key)?;
        let posted = queue.pop_front();
        if queue.is_empty() {
            self.posted.remove(&key);
        }
        posted
    }

    /// Message `seq` of `key` taken by the receive `posted` (detached or not: either way it
    /// is off the wire, which a long message's sender is told).
    fn complete(&mut self, (ctx, from, tag): Key, seq: u64, posted: Posted, data: Vec<u8>) {
        if from != self.me && acknowledged(data.len(), tag) {
            let ack = Outgoing {
                ctx: ACK_CTX,
                tag: 0,
                ticket: 0,
                buf: seq.to_le_bytes().to_vec(),
            };
            self.writer(from).push(ack);
        }
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

    /// `from` acknowledged our message `seq` to it: that send completes.
    fn acknowledged_by(&mut self, from: u32, data: &[u8]) {
        let Ok(seq) = <[u8; 8]>::try_from(data).map(u64::from_le_bytes) else {
            return;
        };
        match self.awaiting.remove(&(from, seq)) {
            Some((ticket, buf)) => self.finish_send(ticket, buf),
            // The writer's `Sent` is still on its way (another thread's event).
            None => {
                self.early_acks.insert((from, seq));
            }
        }
    }

    /// A send is done: its completion, unless detached.
    fn finish_send(&mut self, ticket: Ticket, buf: Vec<u8>) {
        let Some((ctx, _, _)) = self.sending.remove(&ticket) else {
            return;
        };
        if !self.detached.remove(&ticket) {
            self.ready
                .entry(ctx)
                .or_default()
                .push(Done { ticket, buf });
        }
    }

    /// Takes the next message of `(ctx, from, tag)` whatever its length, waiting for it
    /// (what collectives use: no receive is posted on their tag).
    pub fn take(&mut self, ctx: u64, from: u32, tag: u16) -> Result<Vec<u8>, CommError> {
        self.watch(from);
        let key = (ctx, from, tag);
        loop {
            if let Some((_, data)) = self.pop_arrived(key) {
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
            Event::Joined { from } => {
                self.reading.insert(from);
            }
            Event::Arrived {
                from,
                seq,
                ctx,
                tag,
                data,
            } => {
                if ctx == ACK_CTX {
                    return self.acknowledged_by(from, &data);
                }
                let key = (ctx, from, tag);
                match self.pop_posted(key) {
                    Some(p) => self.complete(key, seq, p, data),
                    None => self.arrived.entry(key).or_default().push_back((seq, data)),
                }
            }
            Event::Sent { ticket, seq, buf } => match self.sending.get(&ticket) {
                Some(&(_, peer, true)) if !self.early_acks.remove(&(peer, seq)) => {
                    self.awaiting.insert((peer, seq), (ticket, buf));
                }
                Some(_) => self.finish_send(ticket, buf),
                None => {}
            },
            Event::Gone { peer, why, how } => self.ended(peer, why, how),
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
                .any(|(t, (c, p, _))| *c == ctx && *p == peer && !self.detached.contains(t));
            recv || send
        };
        self.gone.keys().copied().find(|&p| waits_on(p))
    }

    /// The error for world rank `peer`, whose connection ended: [`CommError::PeerGone`],
    /// or, if it could never be reached, [`CommError::Tcp`] naming its address and the fix.
    pub fn gone_error(&self, peer: u32) -> CommError {
        match self.gone.get(&peer) {
            Some((why, Ended::Unreachable)) => CommError::Tcp(format!("rank {peer}: {why}")),
            _ => CommError::PeerGone(peer),
        }
    }

    /// A connection with `peer` ended. An idle outgoing one closed by the peer counts only
    /// once its incoming one has ended too: what it sent before closing may still be read.
    fn ended(&mut self, peer: u32, why: String, how: Ended) {
        match how {
            Ended::Reader => {
                self.reading.remove(&peer);
            }
            Ended::Closed if self.reading.contains(&peer) => return,
            _ => {}
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.gone.entry(peer) {
            tracing::info!("rank {peer}: {why}");
            e.insert((why, how));
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
        self.posted.retain(|_, q| !q.is_empty());
        self.detach(ctx, tickets);
    }

    /// Gives up what `ctx` has in flight (a communicator that gave up on its abort flag):
    /// its posted receives are withdrawn (as `Comm::cancel` does: a message that comes later
    /// waits for a later receive), its queued sends still go, detached.
    pub fn abandon(&mut self, ctx: u64) {
        self.posted.retain(|(c, _, _), _| *c != ctx);
        let sends: Vec<Ticket> = (self.sending.iter())
            .filter(|(_, (c, _, _))| *c == ctx)
            .map(|(t, _)| *t)
            .collect();
        self.detached.extend(sends);
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
