//! The gatherer: this rank's side of the job view's protocol, on a communicator of its own.
//!
//! It owns its state (the communicator, what it posted, which peers are gone) and is
//! driven by [`Gatherer::tick`] from the thread that owns MPI (MPI is `Funneled`, so no other
//! thread may call it): between exchanges from the exchange loop's idle wait, during one from
//! every look the exchange takes at its transport (`Viewed`). A tick does nothing until
//! [`POLL`] passed since the last; then it collects what completed and, once a [`PERIOD`],
//! sends along the view's tree (`tree`): every rank its row, with the latest rows it holds
//! of the ranks below it, up to its parent, so rank 0 assembles the whole table from its
//! few children; and every rank with children that show the table sends them its table,
//! so the table comes down the same tree (each node sending to at most its host's ranks and
//! [`tree::FAN_IN`] leaders, at a bounded rate: `fanout`). Rank 0 thus posts receives for
//! and hears from a few children, not every rank; a row reaches it in `depth` hops.
//!
//! Nothing here ever waits on a peer: receives stay posted (a few per child and from the
//! parent) and are reposted as they complete; a send to a peer whose previous one has not
//! completed is skipped.
//!
//! Leaving says so: [`Gatherer::finish`] sends one last row marked `left` up to its parent
//! (which stops sending it the table and shows it as left, and so does rank 0 once the row
//! came up) and down to its children, which stop sending to it (rank 0's: the job's
//! ranks, each passing it on to its own children, stop sending rows and show the view as
//! ended; another rank's: the ranks below it go quiet and turn stale at rank 0). It waits a
//! bounded moment for those sends. Without it, the others would go on sending to a rank that is gone, and Open MPI
//! keeps messages for a freed communicator for as long as the leaver waits in
//! `MPI_Finalize`. A rank that vanishes without a word goes quiet (its row turns stale); a
//! transport that reports it gone (the in-process one) gets its receives cancelled and
//! nothing more is sent to it. Dropping a gatherer without `finish` (an error, a panic)
//! still cancels its receives, so the communicator can be freed and MPI finalized.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use super::board::{JobBoard, STALE};
use super::fanout::{self, Fanout, SENDS_PER_TICK};
use super::row::RankRow;
use super::tree::{self, FAN_IN, Place};
use super::wire::{self, Aged, FRAME};
use crate::comm::{Comm, CommError, Op, Ticket};
use crate::plan::Rank;

/// How often rows go up and the table down.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);
/// How often a tick looks at the transport at all.
const POLL: Duration = Duration::from_millis(100);
const UP: u16 = 1;
const DOWN: u16 = 2;
/// Receives from the parent kept posted on the ranks that show the table (the others keep
/// one, for rank 0's last word).
const DOWN_POSTED: usize = 8;
/// Receives kept posted from each child (a child sends a frame per few rows below it).
const UP_POSTED: usize = 4;
/// How long a leaving rank waits for its last row to be sent.
const LEAVE_WAIT: Duration = Duration::from_millis(200);
/// Up to this many ranks, every rank gets the table; beyond, each host's first rank only
/// (each parent sends the table's frames to each child that shows it, at a bounded rate:
/// `fanout`).
pub(crate) const ALL_RANKS_UP_TO: u32 = 64;

#[derive(Clone, Copy)]
enum Posted {
    Up(Rank),
    Down,
    Sent(Rank),
}

pub struct Gatherer {
    comm: Box<dyn Comm>,
    board: Arc<JobBoard>,
    /// This rank's row, made once a period.
    mine: Box<dyn FnMut() -> RankRow>,
    posted: HashMap<Ticket, Posted>,
    sending: HashMap<Rank, usize>,
    gone: BTreeSet<Rank>,
    next_poll: Instant,
    next_round: Instant,
    period: Duration,
    never: AtomicBool,
    /// Receives cancelled and sends detached (`close`).
    closed: bool,
    /// The table going down to this rank's children.
    fanout: Fanout,
    place: Place,
    /// Ranks whose rows came up from this rank's children: forwarded to its parent.
    below: BTreeSet<Rank>,
    /// Frames received from children (the simulation's count).
    #[cfg(any(test, feature = "testing"))]
    frames_up: u64,
}

/// Whether `rank` of a job on `hosts` shows the table (see [`ALL_RANKS_UP_TO`]).
pub(crate) fn shows_table(hosts: &[u32], rank: Rank) -> bool {
    let first_on_host = hosts.iter().position(|&h| h == hosts[rank as usize]);
    hosts.len() as u32 <= ALL_RANKS_UP_TO || first_on_host == Some(rank as usize)
}

impl Gatherer {
    /// Starts the view on `comm`, a communicator of its own (split from the job's, so its
    /// messages never meet the exchange's).
    pub(crate) fn new(
        comm: Box<dyn Comm>,
        board: Arc<JobBoard>,
        mine: Box<dyn FnMut() -> RankRow>,
    ) -> Gatherer {
        let now = Instant::now();
        let mut g = Gatherer {
            comm,
            board,
            mine,
            posted: HashMap::new(),
            sending: HashMap::new(),
            gone: BTreeSet::new(),
            next_poll: now,
            next_round: now,
            period: PERIOD,
            never: AtomicBool::new(false),
            closed: false,
            fanout: Fanout::default(),
            place: Place::default(),
            below: BTreeSet::new(),
            #[cfg(any(test, feature = "testing"))]
            frames_up: 0,
        };
        let (me, size) = (g.comm.rank(), g.comm.size());
        g.place = tree::place(g.comm.hosts(), me);
        if me == 0 || shows_table(g.comm.hosts(), me) {
            g.board.start(size);
        }
        g.board
            .stale_after(stale_after(g.comm.hosts(), me, &g.place));
        for c in g.place.children.clone() {
            (0..UP_POSTED).for_each(|_| g.post_recv(Posted::Up(c), c, UP));
        }
        if let Some(parent) = g.place.parent {
            let n = match shows_table(g.comm.hosts(), me) {
                true => DOWN_POSTED,
                false => 1,
            };
            (0..n).for_each(|_| g.post_recv(Posted::Down, parent, DOWN));
        }
        g
    }

    /// Rounds every `period` instead of [`PERIOD`] (tests).
    #[cfg(test)]
    pub(crate) fn with_period(mut self, period: Duration) -> Gatherer {
        self.period = period;
        self
    }

    fn post_recv(&mut self, what: Posted, from: Rank, tag: u16) {
        if self.gone.contains(&from) {
            return;
        }
        match self.comm.post(Op::recv(from, tag, vec![0; FRAME])) {
            Ok(t) => {
                self.posted.insert(t, what);
            }
            Err(e) => self.lost(from, &e),
        }
    }

    fn send(&mut self, to: Rank, tag: u16, frame: Vec<u8>) {
        match self.comm.post(Op::send(to, tag, frame)) {
            Ok(t) => {
                self.posted.insert(t, Posted::Sent(to));
                *self.sending.entry(to).or_default() += 1;
            }
            Err(e) => self.lost(to, &e),
        }
    }

    /// `peer` is gone (or the transport refuses it): no more messages with it.
    fn lost(&mut self, peer: Rank, e: &CommError) {
        if self.gone.insert(peer) {
            tracing::debug!(peer, error = %e, "job view: peer gone");
        }
        let from_peer: Vec<Ticket> = (self.posted.iter())
            .filter(|(_, p)| match p {
                Posted::Up(r) => *r == peer,
                Posted::Down => self.place.parent == Some(peer),
                Posted::Sent(_) => false,
            })
            .map(|(t, _)| *t)
            .collect();
        self.comm.cancel(&from_peer);
        for t in &from_peer {
            self.posted.remove(t);
        }
    }

    /// Does what is due (see the module docs); cheap when nothing is.
    pub(crate) fn tick(&mut self) {
        let now = Instant::now();
        if now < self.next_poll {
            return;
        }
        self.next_poll = now + (self.period / 10).min(POLL);
        self.collect();
        if now >= self.next_round {
            self.next_round = now + self.period;
            self.round();
        }
        if !self.fanout.is_empty() {
            self.drain();
        }
    }

    /// Sends at most [`SENDS_PER_TICK`] frames of the table to children (see `fanout`).
    fn drain(&mut self) {
        for _ in 0..SENDS_PER_TICK {
            let (board, period) = (&self.board, self.period);
            let Some((to, frame)) = self.fanout.next(period, || table_frames(board)) else {
                return;
            };
            if !self.gone.contains(&to) {
                self.send(to, DOWN, frame);
            }
        }
    }

    fn collect(&mut self) {
        loop {
            let done = match self.comm.progress(Duration::ZERO, &self.never) {
                Ok(done) if done.is_empty() => return,
                Ok(done) => done,
                Err(CommError::PeerGone(peer)) => {
                    self.lost(peer, &CommError::PeerGone(peer));
                    continue;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "job view: transport refused; view stopped");
                    self.posted.clear();
                    self.gone.extend(0..self.comm.size());
                    return;
                }
            };
            for d in done {
                match self.posted.remove(&d.ticket) {
                    Some(Posted::Up(from)) => self.got_rows(from, &d.buf),
                    Some(Posted::Down) => self.got_table(&d.buf),
                    Some(Posted::Sent(to)) => {
                        self.sending.entry(to).and_modify(|n| *n -= 1);
                    }
                    None => {}
                }
            }
        }
    }

    /// Rows from child `from` (its own and those below it); its own last row (`left`) ends
    /// all messages with it.
    fn got_rows(&mut self, from: Rank, frame: &[u8]) {
        let now = Instant::now();
        #[cfg(any(test, feature = "testing"))]
        {
            self.frames_up += 1;
        }
        let mut left = false;
        for Aged(age, row) in wire::read_down(frame) {
            left |= row.rank == from && row.left;
            self.below.insert(row.rank);
            let made = now.checked_sub(Duration::from_millis(age));
            self.board.put(row, made.unwrap_or(now));
        }
        if left {
            tracing::debug!(peer = from, "job view: rank left");
            self.gone.insert(from);
            self.fanout.drop_peer(from);
        } else {
            self.post_recv(Posted::Up(from), from, UP);
        }
    }

    /// A part of the table from the parent; rank 0's last row in it ends the view (passed
    /// on to this rank's children), the parent's own last row ends messages with it.
    fn got_table(&mut self, frame: &[u8]) {
        let now = Instant::now();
        let Some(parent) = self.place.parent else {
            return;
        };
        let (mut ended, mut orphaned) = (false, false);
        for Aged(age, row) in wire::read_down(frame) {
            ended |= row.rank == 0 && row.left;
            orphaned |= row.rank == parent && row.left;
            let made = now.checked_sub(Duration::from_millis(age));
            self.board.put(row, made.unwrap_or(now));
        }
        if ended {
            self.board.end();
            for c in self.place.children.clone() {
                if !self.gone.contains(&c) {
                    self.send(c, DOWN, frame.to_vec());
                }
            }
        }
        if ended || orphaned {
            self.lost(parent, &CommError::PeerGone(parent));
        } else {
            self.post_recv(Posted::Down, parent, DOWN);
        }
    }

    /// Once a period: this rank's row into its own board, then up with the rows from below
    /// it, and a new table down to its children once the last went out.
    fn round(&mut self) {
        let row = (self.mine)();
        let me = self.comm.rank();
        if me == 0 || shows_table(self.comm.hosts(), me) {
            self.board.put_own(row.clone(), Instant::now());
        }
        if let Some(parent) = self.place.parent.filter(|&p| self.idle_towards(p)) {
            for frame in self.rows_up(row) {
                self.send(parent, UP, frame);
            }
        }
        if !self.fanout.is_empty() {
            return;
        }
        let hosts = self.comm.hosts();
        let to: Vec<Rank> = (self.place.children.iter().copied())
            .filter(|&r| shows_table(hosts, r) && self.idle_towards(r))
            .collect();
        if !to.is_empty() {
            self.fanout.start(table_frames(&self.board), to.into_iter());
        }
    }

    /// This rank's `row` and the latest it holds of the ranks below it, as frames.
    fn rows_up(&self, row: RankRow) -> Vec<Vec<u8>> {
        let mut rows = vec![Aged(0, row)];
        if !self.below.is_empty() {
            let held = self.board.rows().into_iter();
            let below = held.filter(|(_, r)| self.below.contains(&r.rank));
            rows.extend(below.map(|(age, r)| Aged(age.as_millis() as u64, r)));
        }
        wire::down(&rows)
    }

    /// Whether `peer` is there and every earlier send to it completed.
    fn idle_towards(&self, peer: Rank) -> bool {
        !self.gone.contains(&peer) && self.sending.get(&peer).copied().unwrap_or(0) == 0
    }

    /// Ends the view: this rank's last row, marked `left`, goes to rank 0 (rank 0's to every
    /// rank), then receives are cancelled and sends left to complete as the communicator is
    /// dropped (they are eager, see `wire`).
    pub fn finish(mut self) {
        self.leave();
    }

    /// What `finish` does, leaving the communicator in place (tests keep it, so that the
    /// in-process transport does not report this rank gone before its last row arrives).
    pub(super) fn leave(&mut self) {
        if self.closed {
            return;
        }
        self.collect();
        self.say_goodbye();
        self.close();
    }

    fn say_goodbye(&mut self) {
        let mut row = (self.mine)();
        row.left = true;
        let me = self.comm.rank();
        if me == 0 || shows_table(self.comm.hosts(), me) {
            self.board.put_own(row.clone(), Instant::now());
        }
        let Some(frame) = wire::down(&[Aged(0, row)]).pop() else {
            return;
        };
        let up = self.place.parent.map(|p| (p, UP));
        let down = self.place.children.iter().map(|&c| (c, DOWN));
        let to: Vec<(Rank, u16)> = (down.chain(up))
            .filter(|(p, _)| !self.gone.contains(p))
            .collect();
        for (peer, tag) in to {
            self.send(peer, tag, frame.clone());
        }
        let until = Instant::now() + LEAVE_WAIT;
        while self.sending.values().any(|&n| n > 0) && Instant::now() < until {
            self.collect();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Cancels what is posted to receive and leaves what is sending to complete on its own;
    /// once (`finish`, then `drop`).
    fn close(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        let pick = |sent: bool| -> Vec<Ticket> {
            (self.posted.iter())
                .filter(|(_, p)| matches!(p, Posted::Sent(_)) == sent)
                .map(|(t, _)| *t)
                .collect()
        };
        let (recvs, sends) = (pick(false), pick(true));
        self.comm.cancel(&recvs);
        self.comm.detach(&sends);
        self.posted.clear();
    }

    /// Frames received from children so far (the simulation).
    #[cfg(feature = "testing")]
    pub(super) fn frames_received(&self) -> u64 {
        self.frames_up
    }

    /// Whether this rank no longer exchanges with `peer` (tests).
    #[cfg(test)]
    pub(super) fn done_with(&self, peer: Rank) -> bool {
        self.gone.contains(&peer)
    }
}

/// How old a row may get before the status calls it stale on `me`: rank 0 hears of a row
/// up to a period late per hop; the others get rows with the table, which comes down one
/// level per table interval (`fanout`), from parents with at most `FAN_IN` leaders and
/// their host's ranks to send to.
fn stale_after(hosts: &[u32], me: Rank, place: &Place) -> Duration {
    let depth = place.depth.max(1) as u32;
    if me == 0 {
        return STALE + PERIOD * depth;
    }
    let size = hosts.len() as u32;
    let mine = hosts.get(me as usize);
    let per_host = hosts.iter().filter(|&h| Some(h) == mine).count();
    let to = (FAN_IN + per_host).min(hosts.len()) as u32;
    STALE + (PERIOD + fanout::table_interval(PERIOD, size, to)) * depth
}

/// The board's rows as frames of the table.
fn table_frames(board: &JobBoard) -> Vec<Vec<u8>> {
    let table: Vec<Aged> = (board.rows().into_iter())
        .map(|(age, row)| Aged(age.as_millis() as u64, row))
        .collect();
    wire::down(&table)
}

/// A view dropped without `finish` (an error or a panic on the way out) must not leave
/// receives posted: the transport would abandon them and skip `MPI_Finalize`, which makes
/// mpirun abort every rank.
impl Drop for Gatherer {
    fn drop(&mut self) {
        self.close();
    }
}
