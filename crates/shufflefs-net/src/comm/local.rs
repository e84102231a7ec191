//! M ranks in one process: one channel per ordered pair of ranks.
//!
//! Collectives are built from point-to-point sends, like a naive MPI: because every rank
//! runs the same collectives in the same order and each pair's channel is FIFO, no matching
//! beyond "next message from that peer" is needed. Point-to-point messages carry a tag and
//! are parked per (peer, tag) until asked for, so interleaved tags work as under MPI.
//!
//! Sub-communicators ([`Comm::split`]) are new worlds of their own. Channels cannot carry
//! endpoints, so the endpoints of one world share a registry: the lowest rank of each color
//! builds the sub-world, leaves its endpoints there and tells the others (over the parent's
//! channels) to collect theirs. The registry holds nothing between splits, so a rank that
//! drops its endpoint still disconnects its peers (they see `PeerGone`), as before.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Comm, CommError, Dir, Done, Op, Reduce, Ticket, host_indices, words};
use crate::plan::Rank;
use crate::sys::sync::Locked;

/// Tag reserved for collectives.
const COLLECTIVE: u16 = u16::MAX;
/// How often a waiting receive looks at its abort flag.
const POLL: Duration = Duration::from_millis(20);

/// Sub-world endpoints waiting to be collected, by (split number, color).
type Pending = HashMap<(u64, u32), Vec<Option<LocalComm>>>;
type Registry = Arc<Mutex<Pending>>;

pub struct LocalComm {
    rank: Rank,
    hosts: Vec<u32>,
    to: Vec<Sender<(u16, Vec<u8>)>>,
    from: Vec<Receiver<(u16, Vec<u8>)>>,
    parked: HashMap<(Rank, u16), VecDeque<Vec<u8>>>,
    registry: Registry,
    /// Splits done so far: the same on every rank, as splits are collective.
    splits: u64,
    /// Posted receives not matched yet, oldest first, per (peer, tag): ticket and length.
    expected: HashMap<(Rank, u16), VecDeque<(Ticket, usize)>>,
    /// Completed messages not returned by `progress` yet.
    ready: Vec<Done>,
    detached: HashSet<Ticket>,
    next_ticket: Ticket,
}

impl LocalComm {
    /// Builds the `size` endpoints of one world, all on host 0; hand one to each thread.
    pub fn world(size: u32) -> Vec<LocalComm> {
        LocalComm::world_on_hosts(&vec![0; size as usize])
    }

    /// Builds one world with rank `r` on host `hosts[r]` (renumbered by first appearance).
    pub fn world_on_hosts(hosts: &[u32]) -> Vec<LocalComm> {
        let n = hosts.len();
        let hosts = host_indices(hosts);
        let registry = Registry::default();
        // pipes[a][b] carries a -> b.
        let mut senders: Vec<Vec<Option<Sender<_>>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        let mut receivers: Vec<Vec<Option<Receiver<_>>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        for a in 0..n {
            for b in 0..n {
                let (tx, rx) = channel();
                senders[a][b] = Some(tx);
                receivers[b][a] = Some(rx);
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(r, (to, from))| LocalComm {
                rank: r as Rank,
                hosts: hosts.clone(),
                to: to.into_iter().map(Option::unwrap).collect(),
                from: from.into_iter().map(Option::unwrap).collect(),
                parked: HashMap::new(),
                registry: registry.clone(),
                splits: 0,
                expected: HashMap::new(),
                ready: Vec::new(),
                detached: HashSet::new(),
                next_ticket: 0,
            })
            .collect()
    }

    /// A message from `from` with `tag` arrived: it completes the oldest receive posted for
    /// it, or waits (parked) for one.
    fn deliver(&mut self, from: Rank, tag: u16, msg: Vec<u8>) -> Result<(), CommError> {
        let Some((ticket, len)) = self
            .expected
            .get_mut(&(from, tag))
            .and_then(VecDeque::pop_front)
        else {
            self.parked.entry((from, tag)).or_default().push_back(msg);
            return Ok(());
        };
        if msg.len() != len {
            return Err(CommError::Length {
                from,
                expected: len,
                got: msg.len(),
            });
        }
        if !self.detached.remove(&ticket) {
            self.ready.push(Done { ticket, buf: msg });
        }
        Ok(())
    }

    /// Whether a receive from `peer` is still posted.
    fn expects_from(&self, peer: Rank) -> bool {
        (self.expected.iter()).any(|(&(p, _), q)| p == peer && !q.is_empty())
    }

    fn raw_send(&self, to: Rank, tag: u16, data: Vec<u8>) -> Result<(), CommError> {
        self.to[to as usize]
            .send((tag, data))
            .map_err(|_| CommError::PeerGone(to))
    }

    /// The next collective message from `from`; point-to-point ones met on the way are
    /// delivered to their receives (or parked).
    fn raw_recv(&mut self, from: Rank) -> Result<Vec<u8>, CommError> {
        if let Some(msg) = self
            .parked
            .get_mut(&(from, COLLECTIVE))
            .and_then(VecDeque::pop_front)
        {
            return Ok(msg);
        }
        loop {
            let (t, msg) = match self.from[from as usize].recv_timeout(POLL) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Err(CommError::PeerGone(from)),
            };
            if t == COLLECTIVE {
                return Ok(msg);
            }
            self.deliver(from, t, msg)?;
        }
    }
}

impl Comm for LocalComm {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> u32 {
        self.to.len() as u32
    }

    fn hosts(&self) -> &[u32] {
        &self.hosts
    }

    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        for peer in 0..self.size() {
            self.raw_send(peer, COLLECTIVE, data.to_vec())?;
        }
        (0..self.size()).map(|peer| self.raw_recv(peer)).collect()
    }

    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        if self.rank == root {
            for peer in (0..self.size()).filter(|&p| p != root) {
                self.raw_send(peer, COLLECTIVE, data.clone())?;
            }
            Ok(data)
        } else {
            self.raw_recv(root)
        }
    }

    /// Up a star and back: every rank sends its values to rank 0, which combines them and
    /// sends the result to all (2(M-1) messages of `values.len()` words, where an
    /// all-gather sends M x M).
    fn all_reduce(&mut self, values: &[u64], op: Reduce) -> Result<Vec<u64>, CommError> {
        let bytes = |v: &[u64]| -> Vec<u8> { v.iter().flat_map(|w| w.to_le_bytes()).collect() };
        if self.rank != 0 {
            self.raw_send(0, COLLECTIVE, bytes(values))?;
            return Ok(words(&self.raw_recv(0)?));
        }
        let mut all = vec![values.to_vec()];
        for peer in 1..self.size() {
            all.push(words(&self.raw_recv(peer)?));
        }
        let result = op.fold(&all);
        for peer in 1..self.size() {
            self.raw_send(peer, COLLECTIVE, bytes(&result))?;
        }
        Ok(result)
    }

    fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError> {
        let key = (self.splits, color);
        self.splits += 1;
        let colors: Vec<u32> = self
            .all_gather(&color.to_le_bytes())?
            .iter()
            .map(|c| u32::from_le_bytes(c[..].try_into().expect("4 bytes")))
            .collect();
        let members: Vec<Rank> = (0..self.size())
            .filter(|&r| colors[r as usize] == color)
            .collect();
        let leader = members[0];
        if self.rank == leader {
            let hosts: Vec<u32> = members.iter().map(|&r| self.hosts[r as usize]).collect();
            let endpoints = LocalComm::world_on_hosts(&hosts);
            self.registry
                .locked()
                .insert(key, endpoints.into_iter().map(Some).collect());
            for &peer in &members[1..] {
                self.raw_send(peer, COLLECTIVE, Vec::new())?;
            }
        } else {
            self.raw_recv(leader)?;
        }
        let me = members
            .iter()
            .position(|&r| r == self.rank)
            .expect("member");
        let mut registry = self.registry.locked();
        let slots = registry
            .get_mut(&key)
            .expect("the leader registered the split");
        let mine = slots[me].take().expect("each endpoint is collected once");
        if slots.iter().all(Option::is_none) {
            registry.remove(&key);
        }
        Ok(Box::new(mine))
    }

    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        assert_ne!(op.tag, COLLECTIVE, "tag {COLLECTIVE} is reserved");
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        match op.dir {
            // Channels never block the sender: a send completes at once and its message
            // waits in the channel until its receive comes round.
            Dir::Send => {
                self.raw_send(op.peer, op.tag, op.buf)?;
                self.ready.push(Done {
                    ticket,
                    buf: Vec::new(),
                });
            }
            Dir::Recv => {
                let key = (op.peer, op.tag);
                let expected = self.expected.entry(key).or_default();
                expected.push_back((ticket, op.buf.len()));
                if let Some(msg) = self.parked.get_mut(&key).and_then(VecDeque::pop_front) {
                    self.deliver(op.peer, op.tag, msg)?;
                }
            }
        }
        Ok(ticket)
    }

    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        let until = Instant::now() + wait;
        loop {
            let peers: Vec<Rank> = (self.expected.iter())
                .filter(|(_, q)| !q.is_empty())
                .map(|(&(peer, _), _)| peer)
                .collect();
            for peer in peers {
                loop {
                    match self.from[peer as usize].try_recv() {
                        Ok((tag, msg)) => self.deliver(peer, tag, msg)?,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            if self.expects_from(peer) {
                                return Err(CommError::PeerGone(peer));
                            }
                            break;
                        }
                    }
                }
            }
            if !self.ready.is_empty() {
                return Ok(std::mem::take(&mut self.ready));
            }
            let waiting = (self.expected.values().flatten())
                .any(|(ticket, _)| !self.detached.contains(ticket));
            if !waiting {
                return Ok(Vec::new());
            }
            if abort.load(Ordering::Relaxed) {
                self.expected.clear();
                self.detached.clear();
                return Err(CommError::Aborted);
            }
            if Instant::now() >= until {
                return Ok(Vec::new());
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn detach(&mut self, tickets: &[Ticket]) {
        self.ready.retain(|d| !tickets.contains(&d.ticket));
        let posted: Vec<Ticket> = (self.expected.values().flatten())
            .map(|(t, _)| *t)
            .filter(|t| tickets.contains(t))
            .collect();
        self.detached.extend(posted);
    }

    /// A cancelled receive is dropped from the queues at once, so it neither matches a later
    /// message nor counts as waiting on its peer (a detached one would, and a peer that has
    /// ended would then answer `PeerGone`).
    fn cancel(&mut self, tickets: &[Ticket]) {
        self.ready.retain(|d| !tickets.contains(&d.ticket));
        for queue in self.expected.values_mut() {
            queue.retain(|(t, _)| !tickets.contains(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{agree, decide};

    #[test]
    fn collectives_across_threads() {
        let handles: Vec<_> = LocalComm::world(4)
            .into_iter()
            .map(|mut c| {
                std::thread::spawn(move || {
                    let me = c.rank();
                    assert_eq!(c.hosts(), [0, 0, 0, 0]);
                    let all = c.all_gather(&[me as u8]).unwrap();
                    assert_eq!(all, vec![vec![0], vec![1], vec![2], vec![3]]);
                    let b = c.broadcast(2, vec![me as u8; 3]).unwrap();
                    assert_eq!(b, vec![2, 2, 2]);
                    let v = [u64::from(me), 10 - u64::from(me)];
                    assert_eq!(c.all_reduce(&v, Reduce::Max).unwrap(), [3, 10]);
                    assert_eq!(c.all_reduce(&v, Reduce::Min).unwrap(), [0, 7]);
                    assert_eq!(c.all_reduce(&v, Reduce::Sum).unwrap(), [6, 34]);
                    let d = decide(&mut c, || Err::<Vec<u8>, _>("no samples")).unwrap();
                    assert_eq!(d, Err("no samples".to_string()));
                    let failures = agree(
                        &mut c,
                        if me == 3 {
                            Err("bad mount".into())
                        } else {
                            Ok(())
                        },
                    )
                    .unwrap();
                    assert_eq!(failures, vec![(3, "bad mount".to_string())]);
                    // A shift: send to the next rank, receive from the previous one.
                    let (next, prev) = ((me + 1) % 4, (me + 3) % 4);
                    let abort = AtomicBool::new(false);
                    let mut got = [0u8; 2];
                    c.sendrecv(
                        1,
                        Some((next, &[me as u8, 7])),
                        Some((prev, &mut got)),
                        &abort,
                    )
                    .unwrap();
                    assert_eq!(got, [prev as u8, 7]);
                    // Everyone to everyone in one batch.
                    let others: Vec<Rank> = (0..4).filter(|&p| p != me).collect();
                    let payload = [me as u8; 5];
                    let sends: Vec<_> = others.iter().map(|&p| (p, &payload[..])).collect();
                    let mut bufs = vec![[0u8; 5]; 3];
                    let mut recvs: Vec<_> = others
                        .iter()
                        .copied()
                        .zip(bufs.iter_mut().map(|b| &mut b[..]))
                        .collect();
                    c.sendrecv_many(2, &sends, &mut recvs, &abort).unwrap();
                    for (p, b) in others.iter().zip(&bufs) {
                        assert_eq!(*b, [*p as u8; 5]);
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
    }

    /// Four ranks on two hosts split by parity: each pair runs collectives and a sendrecv
    /// of its own, numbered in parent order, with the hosts carried over.
    #[test]
    fn split_into_two_groups() {
        let handles: Vec<_> = LocalComm::world_on_hosts(&[7, 7, 3, 3])
            .into_iter()
            .map(|mut c| {
                std::thread::spawn(move || {
                    let me = c.rank();
                    assert_eq!(c.hosts(), [0, 0, 1, 1]);
                    let mut sub = c.split(me % 2).unwrap();
                    assert_eq!(sub.size(), 2);
                    assert_eq!(sub.rank(), me / 2);
                    assert_eq!(sub.hosts(), [0, 1]);
                    let all = sub.all_gather(&[me as u8]).unwrap();
                    assert_eq!(all, vec![vec![(me % 2) as u8], vec![(me % 2 + 2) as u8]]);
                    let b = sub.broadcast(1, vec![me as u8]).unwrap();
                    assert_eq!(b, vec![(me % 2 + 2) as u8]);
                    let other = 1 - sub.rank();
                    let mut got = [0u8; 1];
                    let abort = AtomicBool::new(false);
                    sub.sendrecv(
                        3,
                        Some((other, &[me as u8])),
                        Some((other, &mut got)),
                        &abort,
                    )
                    .unwrap();
                    assert_eq!(got[0] as u32, (me + 2) % 4);
                    // The parent still works, and a second split gets a world of its own.
                    assert_eq!(c.all_gather(&[]).unwrap().len(), 4);
                    let mut whole = c.split(0).unwrap();
                    assert_eq!((whole.rank(), whole.size()), (me, 4));
                    assert_eq!(whole.all_gather(&[1]).unwrap().len(), 4);
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
    }
}
