//! The view's protocol over in-process ranks: rows reach rank 0 and come back to every rank,
//! and a rank that goes away neither blocks nor breaks the others.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use crate::comm::{Comm, CommError, Done, LocalComm, Op, Ticket};
use crate::plan::Rank;

const FAST: Duration = Duration::from_millis(30);

/// Rank `rank`'s gatherer over its own split of `world`, whose rows count up the epoch.
fn gatherer(mut world: LocalComm, board: Arc<JobBoard>) -> Gatherer {
    let own = world.split(0).unwrap();
    let rank = world.rank();
    let mut epoch = 0;
    let rows = Box::new(move || {
        epoch += 1;
        RankRow {
            rank,
            host: format!("h{rank}"),
            epoch,
            ..RankRow::default()
        }
    });
    Gatherer::new(own, board, rows).with_period(FAST)
}

/// Ticks until `done` holds or `limit` passed; whether it held.
fn tick_until(g: &mut Gatherer, limit: Duration, done: impl Fn() -> bool) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        g.tick();
        if done() {
            return true;
        }
        thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Every rank's board holds every rank's row, fresh.
fn holds_all(board: &JobBoard, size: u32, min_epoch: u64) -> bool {
    let rows = board.rows();
    rows.len() == size as usize
        && rows
            .iter()
            .all(|(age, r)| r.epoch >= min_epoch && *age < Duration::from_secs(1))
}

#[test]
fn every_rank_sees_the_whole_job_and_a_leaver_blocks_nobody() {
    let size = 3;
    // Ranks that saw the whole job; each keeps ticking until all did (a rank that stopped
    // ticking would starve the others).
    let saw = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = LocalComm::world(size)
        .into_iter()
        .map(|world| {
            let (saw, done) = (saw.clone(), done.clone());
            thread::spawn(move || {
                let me = world.rank();
                let board = Arc::new(JobBoard::default());
                let mut g = gatherer(world, board.clone());
                let seen = tick_until(&mut g, Duration::from_secs(10), || {
                    holds_all(&board, size, 2)
                });
                assert!(seen, "rank {me} saw {:?}", board.rows());
                saw.fetch_add(1, Ordering::SeqCst);
                let all = tick_until(&mut g, Duration::from_secs(20), || {
                    saw.load(Ordering::SeqCst) == size as usize
                });
                assert!(all, "rank {me}: the others did not see the whole job");
                if me == 2 {
                    // Leaves: its endpoints go, the others learn it is gone.
                    g.finish();
                    return;
                }
                // The others go on: rank 2's row stops changing, theirs keep coming.
                let before = board.rows()[2].1.epoch;
                let fresh = tick_until(&mut g, Duration::from_secs(10), || {
                    let rows = board.rows();
                    rows[0].1.epoch > before + 3 && rows[1].1.epoch > before + 3
                });
                assert!(fresh, "rank {me} saw {:?}", board.rows());
                let rows = board.rows();
                // Its last row said it left (or, before that arrived, it went quiet).
                assert!(rows[2].1.epoch <= before + 2 && (rows[2].1.left || rows[2].0 > FAST * 3));
                let job = board.json().unwrap();
                assert_eq!(job["ranks"][1]["host"], "h1");
                // Each keeps the other fed until both saw what they needed.
                done.fetch_add(1, Ordering::SeqCst);
                tick_until(&mut g, Duration::from_secs(20), || {
                    done.load(Ordering::SeqCst) == 2
                });
                g.finish();
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
}

/// Beyond [`ALL_RANKS_UP_TO`] ranks only each host's first rank gets the table.
#[test]
fn large_jobs_send_the_table_to_each_hosts_first_rank() {
    let hosts: Vec<u32> = (0..100).map(|r| r / 4).collect();
    assert!(gather::shows_table(&hosts, 0) && gather::shows_table(&hosts, 4));
    assert!(!gather::shows_table(&hosts, 5));
    assert!(gather::shows_table(&hosts[..8], 5));
}

/// The wrapper ticks the view when the exchange loop idles and while the exchange polls
/// its transport (see `Viewed::progress`), so rows stay live during an exchange.
#[test]
fn the_wrapper_ticks_on_idle_and_inside_an_exchange() {
    let mut worlds = LocalComm::world(1);
    let mut world = worlds.pop().unwrap();
    let board = Arc::new(JobBoard::default());
    let mut g = gatherer(LocalComm::world(1).pop().unwrap(), board.clone());
    let mut viewed = Viewed {
        inner: &mut world,
        view: &mut g,
    };
    viewed.idle();
    assert_eq!(board.rows().len(), 1);
    thread::sleep(FAST * 2);
    let never = AtomicBool::new(false);
    viewed.progress(Duration::ZERO, &never).unwrap();
    assert_eq!(
        board.rows()[0].1.epoch,
        2,
        "a new row while the exchange polls"
    );
    thread::sleep(FAST * 2);
    viewed.idle();
    assert_eq!(board.rows()[0].1.epoch, 3);
}

/// A leaver says so: rank 0 stops sending to it and shows it as `left` (not stale); when rank
/// 0 leaves, the others stop sending rows and show the view as ended. The leavers' threads
/// wait until the others saw it, so no transport reports them gone: the `left` rows alone
/// carry the news.
#[test]
fn leavers_say_so_and_rank_0_leaving_ends_the_view() {
    let size = 3;
    let steps: Arc<Vec<AtomicUsize>> = Arc::new((0..4).map(|_| AtomicUsize::new(0)).collect());
    let handles: Vec<_> = LocalComm::world(size)
        .into_iter()
        .map(|world| {
            let steps = steps.clone();
            thread::spawn(move || {
                let me = world.rank();
                let board = Arc::new(JobBoard::default());
                let mut g = gatherer(world, board.clone());
                let wait = |g: &mut Gatherer, step: usize, n: usize| {
                    steps[step].fetch_add(1, Ordering::SeqCst);
                    let all = tick_until(g, Duration::from_secs(20), || {
                        steps[step].load(Ordering::SeqCst) >= n
                    });
                    assert!(all, "rank {me}: step {step}");
                };
                let seen = tick_until(&mut g, Duration::from_secs(10), || {
                    holds_all(&board, size, 2)
                });
                assert!(seen, "rank {me} saw {:?}", board.rows());
                wait(&mut g, 0, 3);
                if me == 2 {
                    g.leave();
                    // Stays (its endpoint with it) until the others saw it leave.
                    wait_for(&steps[1], 2);
                    return;
                }
                let left = |b: &JobBoard| b.json().unwrap()["ranks"][2]["left"] == true;
                assert!(tick_until(&mut g, Duration::from_secs(10), || left(&board)));
                let job = board.json().unwrap();
                thread::sleep(FAST * 4);
                assert!(job["ranks"][2].get("stale_s").is_none() && job.get("ended").is_none());
                if me == 0 {
                    assert!(g.done_with(2), "rank 0 still sends to the leaver");
                }
                wait(&mut g, 1, 2);
                if me == 0 {
                    g.leave();
                    wait_for(&steps[2], 1);
                    return;
                }
                let ended = tick_until(&mut g, Duration::from_secs(10), || {
                    board.json().unwrap().get("ended") == Some(&serde_json::json!(true))
                });
                assert!(ended, "rank 1 saw {}", board.json().unwrap());
                assert!(g.done_with(0), "rank 1 still sends rows to rank 0");
                assert_eq!(board.json().unwrap()["ranks"][0]["left"], true);
                steps[2].fetch_add(1, Ordering::SeqCst);
                g.finish();
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
}

fn wait_for(n: &AtomicUsize, at_least: usize) {
    let until = Instant::now() + Duration::from_secs(20);
    while n.load(Ordering::SeqCst) < at_least && Instant::now() < until {
        thread::sleep(Duration::from_millis(2));
    }
}

/// Rank 1 of 2 that never delivers: counts what is posted and what is cancelled.
#[derive(Default)]
struct Counting {
    posted: Vec<Ticket>,
    cancelled: Arc<std::sync::Mutex<Vec<Ticket>>>,
}

impl Comm for Counting {
    fn rank(&self) -> Rank {
        1
    }
    fn size(&self) -> u32 {
        2
    }
    fn hosts(&self) -> &[u32] {
        &[0, 0]
    }
    fn all_gather(&mut self, _: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        unreachable!()
    }
    fn broadcast(&mut self, _: Rank, _: Vec<u8>) -> Result<Vec<u8>, CommError> {
        unreachable!()
    }
    fn split(&mut self, _: u32) -> Result<Box<dyn Comm>, CommError> {
        unreachable!()
    }
    fn post(&mut self, _: Op) -> Result<Ticket, CommError> {
        let t = self.posted.len() as Ticket + 1;
        self.posted.push(t);
        Ok(t)
    }
    fn progress(&mut self, _: Duration, _: &AtomicBool) -> Result<Vec<Done>, CommError> {
        Ok(Vec::new())
    }
    fn detach(&mut self, _: &[Ticket]) {}
    fn cancel(&mut self, tickets: &[Ticket]) {
        self.cancelled.lock().unwrap().extend_from_slice(tickets);
    }
}

/// A view dropped without `finish` (an error on the way out) cancels every receive it
/// posted, and `finish` then drop cancels them once.
#[test]
fn a_dropped_view_cancels_its_receives() {
    for finish in [false, true] {
        let comm = Counting::default();
        let cancelled = comm.cancelled.clone();
        let row = Box::new(RankRow::default);
        let g = Gatherer::new(Box::new(comm), Arc::new(JobBoard::default()), row);
        if finish {
            g.finish();
        } else {
            drop(g);
        }
        let mut c = cancelled.lock().unwrap().clone();
        c.sort();
        c.dedup();
        assert_eq!(c.len(), cancelled.lock().unwrap().len(), "cancelled twice");
        // Rank 1 of a small job keeps 8 receives from rank 0 posted.
        assert_eq!(c.len(), 8, "finish: {finish}");
    }
}

/// Counts the peers its rank posts messages to or from.
struct Watched {
    inner: LocalComm,
    peers: Arc<std::sync::Mutex<std::collections::BTreeSet<Rank>>>,
}

impl Comm for Watched {
    fn rank(&self) -> Rank {
        self.inner.rank()
    }
    fn size(&self) -> u32 {
        self.inner.size()
    }
    fn hosts(&self) -> &[u32] {
        self.inner.hosts()
    }
    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        self.inner.all_gather(data)
    }
    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        self.inner.broadcast(root, data)
    }
    fn split(&mut self, color: u32) -> Result<Box<dyn Comm>, CommError> {
        self.inner.split(color)
    }
    fn post(&mut self, op: Op) -> Result<Ticket, CommError> {
        self.peers.lock().unwrap().insert(op.peer);
        self.inner.post(op)
    }
    fn progress(&mut self, wait: Duration, abort: &AtomicBool) -> Result<Vec<Done>, CommError> {
        self.inner.progress(wait, abort)
    }
    fn detach(&mut self, tickets: &[Ticket]) {
        self.inner.detach(tickets)
    }
    fn cancel(&mut self, tickets: &[Ticket]) {
        self.inner.cancel(tickets)
    }
}

/// 128 ranks on 16 hosts, driven from one thread. Rank 0's table fills with every
/// rank's row and every host's first rank gets the whole table back, while rank 0 only
/// ever talks to its children in the view's tree (its host's ranks and `FAN_IN` leaders),
/// not to every rank as before (it posted a receive from each of the 127 others).
#[test]
fn a_large_job_gathers_up_a_tree_and_rank_0_talks_to_its_children_only() {
    let (size, per_host) = (128u32, 8u32);
    let hosts: Vec<u32> = (0..size).map(|r| r / per_host).collect();
    let peers = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let mut views: Vec<(Arc<JobBoard>, Gatherer)> = LocalComm::world_on_hosts(&hosts)
        .into_iter()
        .map(|world| {
            let rank = world.rank();
            let comm: Box<dyn Comm> = match rank {
                0 => Box::new(Watched {
                    inner: world,
                    peers: peers.clone(),
                }),
                _ => Box::new(world),
            };
            let board = Arc::new(JobBoard::default());
            let mut epoch = 0;
            let rows = Box::new(move || {
                epoch += 1;
                RankRow {
                    rank,
                    host: format!("h{}", rank / per_host),
                    epoch,
                    ..RankRow::default()
                }
            });
            let g = Gatherer::new(comm, board.clone(), rows).with_period(FAST);
            (board, g)
        })
        .collect();
    let whole = |b: &JobBoard| {
        let rows = b.rows();
        rows.len() == size as usize && rows.iter().all(|(_, r)| r.epoch >= 3)
    };
    let leaders: Vec<usize> = (0..size)
        .step_by(per_host as usize)
        .map(|r| r as usize)
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    let mut done = false;
    while !done && Instant::now() < until {
        views.iter_mut().for_each(|(_, g)| g.tick());
        done = leaders.iter().all(|&r| whole(&views[r].0));
        thread::sleep(Duration::from_millis(1));
    }
    let missing: Vec<usize> = leaders
        .iter()
        .copied()
        .filter(|&r| !whole(&views[r].0))
        .collect();
    assert!(done, "host leaders without the whole table: {missing:?}");
    assert!(
        views[1].0.rows().is_empty(),
        "ranks other than leaders hold no table"
    );
    let children = tree::place(&hosts, 0).children;
    let talked: Vec<Rank> = peers.lock().unwrap().iter().copied().collect();
    assert!(
        talked.len() < tree::FAN_IN + per_host as usize
            && talked.iter().all(|p| children.contains(p)),
        "rank 0 talked to {} ranks: {talked:?}",
        talked.len()
    );
}
