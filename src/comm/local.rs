//! M ranks in one process: one channel per ordered pair of ranks.
//!
//! Collectives are built from point-to-point sends, like a naive MPI: because every rank
//! runs the same collectives in the same order and each pair's channel is FIFO, no matching
//! beyond "next message from that peer" is needed. Point-to-point messages carry a tag and
//! are parked per (peer, tag) until asked for, so interleaved tags work as under MPI.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

use super::{Comm, CommError};
use crate::plan::Rank;

/// Tag reserved for collectives.
const COLLECTIVE: u16 = u16::MAX;
/// How often a waiting `sendrecv` looks at its abort flag.
const POLL: Duration = Duration::from_millis(20);

pub struct LocalComm {
    rank: Rank,
    to: Vec<Sender<(u16, Vec<u8>)>>,
    from: Vec<Receiver<(u16, Vec<u8>)>>,
    parked: HashMap<(Rank, u16), VecDeque<Vec<u8>>>,
}

impl LocalComm {
    /// Builds the `size` endpoints of one world; hand one to each thread.
    pub fn world(size: u32) -> Vec<LocalComm> {
        let n = size as usize;
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
                to: to.into_iter().map(Option::unwrap).collect(),
                from: from.into_iter().map(Option::unwrap).collect(),
                parked: HashMap::new(),
            })
            .collect()
    }

    fn raw_send(&self, to: Rank, tag: u16, data: Vec<u8>) -> Result<(), CommError> {
        self.to[to as usize]
            .send((tag, data))
            .map_err(|_| CommError::PeerGone(to))
    }

    /// The next message from `from` with `tag`; gives up once `abort` (if any) is set.
    fn raw_recv(
        &mut self,
        from: Rank,
        tag: u16,
        abort: Option<&AtomicBool>,
    ) -> Result<Vec<u8>, CommError> {
        if let Some(msg) = self
            .parked
            .get_mut(&(from, tag))
            .and_then(VecDeque::pop_front)
        {
            return Ok(msg);
        }
        loop {
            let (t, msg) = match self.from[from as usize].recv_timeout(POLL) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => match abort {
                    Some(a) if a.load(Ordering::Relaxed) => return Err(CommError::Aborted),
                    _ => continue,
                },
                Err(RecvTimeoutError::Disconnected) => return Err(CommError::PeerGone(from)),
            };
            if t == tag {
                return Ok(msg);
            }
            self.parked.entry((from, t)).or_default().push_back(msg);
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

    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        for peer in 0..self.size() {
            self.raw_send(peer, COLLECTIVE, data.to_vec())?;
        }
        (0..self.size())
            .map(|peer| self.raw_recv(peer, COLLECTIVE, None))
            .collect()
    }

    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        if self.rank == root {
            for peer in (0..self.size()).filter(|&p| p != root) {
                self.raw_send(peer, COLLECTIVE, data.clone())?;
            }
            Ok(data)
        } else {
            self.raw_recv(root, COLLECTIVE, None)
        }
    }

    fn sendrecv(
        &mut self,
        tag: u16,
        send: Option<(Rank, &[u8])>,
        recv: Option<(Rank, &mut [u8])>,
        abort: &AtomicBool,
    ) -> Result<(), CommError> {
        assert_ne!(tag, COLLECTIVE, "tag {COLLECTIVE} is reserved");
        // Channels never block the sender, so sending first cannot deadlock here.
        if let Some((to, data)) = send {
            self.raw_send(to, tag, data.to_vec())?;
        }
        if let Some((from, buf)) = recv {
            let msg = self.raw_recv(from, tag, Some(abort))?;
            if msg.len() != buf.len() {
                return Err(CommError::Mpi(format!(
                    "expected {} bytes from rank {from}, got {}",
                    buf.len(),
                    msg.len()
                )));
            }
            buf.copy_from_slice(&msg);
        }
        Ok(())
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
                    let all = c.all_gather(&[me as u8]).unwrap();
                    assert_eq!(all, vec![vec![0], vec![1], vec![2], vec![3]]);
                    let b = c.broadcast(2, vec![me as u8; 3]).unwrap();
                    assert_eq!(b, vec![2, 2, 2]);
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
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
    }
}
