//! A job view of many ranks in one thread, for `benches/jobview_refresh.rs`: the
//! real [`Gatherer`] of every rank over [`Mailboxes`], an in-process transport whose set-up
//! is one inbox per rank (the in-process `LocalComm` makes a channel per pair of ranks,
//! M^2 of them: 16.8 million at 4,096 ranks).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::row::RankRow;
use super::{Gatherer, JobBoard};
use crate::comm::{Comm, CommError, Dir, Done, Op, Ticket};
use crate::plan::Rank;
use crate::sys::sync::Locked;

type Mail = (Rank, u16, Vec<u8>);

/// One rank's end of an in-process world: messages go to the peer's inbox, receives match
/// them by (peer, tag) in order, as under MPI. Point-to-point only.
pub struct Mailboxes {
    me: Rank,
    hosts: Arc<[u32]>,
    inboxes: Arc<Vec<Mutex<VecDeque<Mail>>>>,
    expected: HashMap<(Rank, u16), VecDeque<(Ticket, usize)>>,
    parked: HashMap<(Rank, u16), VecDeque<Vec<u8>>>,
    ready: Vec<Done>,
    next: Ticket,
}

impl Mailboxes {
    /// Endpoints of a world whose rank `r` runs on host `hosts[r]`.
    pub fn world(hosts: &[u32]) -> Vec<Mailboxes> {
        let shared: Arc<[u32]> = hosts.into();
        let inboxes: Arc<Vec<_>> = Arc::new(hosts.iter().map(|_| Mutex::default()).collect());
        (0..hosts.len() as Rank)
            .map(|me| Mailboxes {
                me,
                hosts: shared.clone(),
                inboxes: inboxes.clone(),
                expected: HashMap::new(),
                parked: HashMap::new(),
                ready: Vec::new(),
                next: 0,
            })
            .collect()
    }

    fn deliver(&mut self, (from, tag, msg): Mail) {
        match (self.expected.get_mut(&(from, tag))).and_then(VecDeque::pop_front) {
            Some((ticket, _)) => self.ready.push(Done { ticket, buf: msg }),
            None => self.parked.entry((from, tag)).or_default().push_back(msg),
        }
    }
}

impl Comm for Mailboxes {
    fn rank(&self) -> Rank {
        self.me
    }
    fn size(&self) -> u32 {
        self.hosts.len() as u32
    }
    fn hosts(&self) -> &[u32] {
        &self.hosts
    }
    fn all_gather(&mut self, _: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        Err(CommError::Mpi("no collectives in the simulation".into()))
    }
    fn broadcast(&mut self, _: Rank, _: Vec<u8>) -> Result<Vec<u8>, CommError> {
        Err(CommError::Mpi("no collectives in the simulation".into()))
    }
    fn split(&mut self, _: u32) -> Result<Box<dyn Comm>, CommError> {
        Err(CommError::Mpi("no collectives in the simulation".into()))
    }
    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        self.next += 1;
        let ticket = self.next;
        match op.dir {
            Dir::Send => {
                let inbox = &self.inboxes[op.peer as usize];
                (inbox.locked()).push_back((self.me, op.tag, op.buf));
                self.ready.push(Done {
                    ticket,
                    buf: Vec::new(),
                });
            }
            Dir::Recv => {
                let key = (op.peer, op.tag);
                match self.parked.get_mut(&key).and_then(VecDeque::pop_front) {
                    Some(msg) => self.ready.push(Done { ticket, buf: msg }),
                    None => {
                        (self.expected.entry(key).or_default()).push_back((ticket, op.buf.len()))
                    }
                }
            }
        }
        Ok(ticket)
    }
    fn progress(&mut self, _: Duration, _: &AtomicBool) -> Result<Vec<Done>, CommError> {
        let mail: Vec<Mail> = {
            let inbox = &self.inboxes[self.me as usize];
            (inbox.locked()).drain(..).collect()
        };
        mail.into_iter().for_each(|m| self.deliver(m));
        Ok(std::mem::take(&mut self.ready))
    }
    fn detach(&mut self, tickets: &[Ticket]) {
        self.cancel(tickets);
    }
    fn cancel(&mut self, tickets: &[Ticket]) {
        self.ready.retain(|d| !tickets.contains(&d.ticket));
        for q in self.expected.values_mut() {
            q.retain(|(t, _)| !tickets.contains(t));
        }
    }
}

/// How long the view of a job took to show a change of every rank's row.
#[derive(Clone, Copy, Debug)]
pub struct Refresh {
    /// Until rank 0's table held every rank's new row.
    pub rank_0: Duration,
    /// Until each of the host leaders just under rank 0 held them all (the table coming
    /// down one level), if within the time allowed.
    pub first_level: Option<Duration>,
    /// Frames rank 0 received per second while the rows came up, and the ranks it talked to.
    pub rank_0_frames_per_s: f64,
    pub rank_0_peers: usize,
}

/// Runs the view of `ranks` ranks, `per_host` to a host, with the real one-second period,
/// every rank's row changing once its view settled; waits at most `limit` for the table to
/// come down.
pub fn refresh(ranks: u32, per_host: u32, limit: Duration) -> Refresh {
    let hosts: Vec<u32> = (0..ranks).map(|r| r / per_host.max(1)).collect();
    let epoch = Arc::new(AtomicU64::new(1));
    let mut views: Vec<(Arc<JobBoard>, Gatherer)> = Mailboxes::world(&hosts)
        .into_iter()
        .map(|comm| {
            let (rank, epoch) = (comm.rank(), epoch.clone());
            let board = Arc::new(JobBoard::default());
            let row = Box::new(move || RankRow {
                rank,
                host: format!("node{:04}", rank / per_host.max(1)),
                epoch: epoch.load(Ordering::Relaxed),
                ..RankRow::default()
            });
            (board.clone(), Gatherer::new(Box::new(comm), board, row))
        })
        .collect();
    let at = |b: &JobBoard, e: u64| {
        let rows = b.rows();
        rows.len() == ranks as usize && rows.iter().all(|(_, r)| r.epoch >= e)
    };
    let place = super::tree::place(&hosts, 0);
    let under: Vec<usize> = (place.children.iter())
        .filter(|&&c| super::gather::shows_table(&hosts, c))
        .map(|&c| c as usize)
        .collect();
    // Settle: rank 0 holds every row once.
    let started = Instant::now();
    while !at(&views[0].0, 1) && started.elapsed() < limit {
        views.iter_mut().for_each(|(_, g)| g.tick());
    }
    epoch.store(2, Ordering::Relaxed);
    let (t0, frames0) = (Instant::now(), views[0].1.frames_received());
    let mut rank_0 = None;
    let mut first_level = None;
    while first_level.is_none() && t0.elapsed() < limit {
        views.iter_mut().for_each(|(_, g)| g.tick());
        if rank_0.is_none() && at(&views[0].0, 2) {
            rank_0 = Some((t0.elapsed(), views[0].1.frames_received() - frames0));
        }
        if rank_0.is_some() && under.iter().all(|&c| at(&views[c].0, 2)) {
            first_level = Some(t0.elapsed());
        }
    }
    let (rank_0, frames) = rank_0.unwrap_or((limit, 0));
    Refresh {
        rank_0,
        first_level,
        rank_0_frames_per_s: frames as f64 / rank_0.as_secs_f64().max(1e-3),
        rank_0_peers: place.children.len(),
    }
}
