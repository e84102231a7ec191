//! When to stop waiting for a slow peer.
//!
//! A peer whose link is much slower than the others' (a congested switch port, a node
//! shaped to a tenth) must not hold every other rank's next epoch. Each incoming stream is
//! measured as it completes; once at least half of the non-empty incoming streams are
//! complete, a stream still arriving is *overdue* when the time it would take in all, at
//! the rate it has shown so far, exceeds `factor` times what its bytes would take at the
//! rate of the slowest completed stream, plus a slack: `grace`, but never more than the
//! longest completed stream took nor less than a quarter of `grace`, so that a fixed grace
//! does not dominate a small exchange. A stream that has not shown a byte yet (its size list
//! has not arrived, or its first frame) is judged as before by its time so far against
//! `factor` times its expected time plus the whole `grace`: a peer that merely started late
//! (it was draining its previous exchange, or descheduled on a loaded node) is not a slow
//! link. The
//! receiver then gives that peer up: samples it already stored from it stay, the rest are
//! fetched from the source, and the peer is told to stop after the frames it already posted
//! (see the executor's docs).
//!
//! Projecting from the stream's own rate is what lets a rank give up a peer ten or a
//! hundred times slower as soon as the others are in, rather than `factor` times their time
//! later: the epoch's own measured rates set the deadline. The same rule, applied by a
//! sender to its outgoing streams once it settled, stops sending to a receiver far slower
//! than the others (that receiver fetches the rest from the source).
//!
//! The rule is relative on purpose: a rank whose own link is slow sees every stream slow
//! alike and gives nobody up. It compares with the *slowest* completed stream, not the
//! median, because streams sharing one link finish unevenly (TCP is not fair between them:
//! on a link shaped to 25 Mbit/s, three equal streams finished after 1.1, 2.9 and 3.4 s),
//! and a rate measured while streams share the link underestimates what a lone stream
//! gets; both err on the side of waiting.

use std::time::Duration;

/// Settings of the slow-peer rule (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowPeers {
    /// How many times its expected time a stream may take; 0 never gives up.
    pub factor: f64,
    /// Added to every deadline, so jitter on small exchanges never gives a peer up.
    pub grace: Duration,
    /// After this rank settled, a peer it still exchanges with (draining its late bytes,
    /// or sending to it) that completes no message for this long is abandoned: its
    /// messages are detached and its streams end. Only a peer that stopped (a broken
    /// transport, a stopped process) gets there; under MPI a dead rank ends the job first.
    pub idle: Duration,
}

impl Default for SlowPeers {
    fn default() -> Self {
        SlowPeers {
            factor: 4.0,
            grace: Duration::from_secs(2),
            idle: Duration::from_secs(60),
        }
    }
}

/// An incoming stream as the rule sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Progress {
    /// Bytes of the stream (when its size list has not arrived: an estimate, see `estimate`).
    pub bytes: u64,
    /// Bytes of it that arrived so far.
    pub done: u64,
    /// Time since the stream started (see the module docs).
    pub elapsed: Duration,
    /// Time from the stream's start to its last byte over the transport, if complete.
    pub took: Option<Duration>,
    /// Whether its bytes cross the transport. A stream taken from a peer's cache on this
    /// host only waits for the size list: it is not rated, and it is overdue once it took
    /// `factor` times the longest completed stream's time, plus `grace`.
    pub rated: bool,
}

impl SlowPeers {
    /// Which of `streams` are overdue.
    pub(crate) fn overdue(&self, streams: &[Progress]) -> Vec<bool> {
        let none = vec![false; streams.len()];
        if self.factor <= 0.0 {
            return none;
        }
        let rated: Vec<&Progress> = streams.iter().filter(|s| s.rated && s.bytes > 0).collect();
        let mut rates: Vec<f64> = (rated.iter())
            .filter_map(|s| s.took.map(|t| s.bytes as f64 / t.as_secs_f64().max(1e-3)))
            .collect();
        let mut times: Vec<Duration> = rated.iter().filter_map(|s| s.took).collect();
        if rates.is_empty() || rates.len() * 2 < rated.len() {
            return none;
        }
        rates.sort_by(f64::total_cmp);
        times.sort();
        let (slowest, longest) = (rates[0], times[times.len() - 1]);
        let slack = self.grace.min(longest).max(self.grace / 4);
        (streams.iter())
            .map(|s| {
                let expected = if s.rated {
                    Duration::from_secs_f64(s.bytes as f64 / slowest)
                } else {
                    longest
                };
                let limit = expected.mul_f64(self.factor);
                let shown = s.rated && s.done > 0 && s.done < s.bytes;
                s.took.is_none()
                    && match shown {
                        true => s.elapsed > slack && projected(s) > limit + slack,
                        false => s.elapsed > limit + self.grace,
                    }
            })
            .collect()
    }
}

/// How long a stream that has shown some of its bytes takes in all, at its rate so far.
fn projected(s: &Progress) -> Duration {
    s.elapsed.mul_f64(s.bytes as f64 / s.done as f64)
}

/// Bytes of a stream of `samples` samples whose sizes are not known yet: at the mean size
/// per sample of the streams whose sizes are.
pub(crate) fn estimate(samples: usize, known: &[(u64, usize)]) -> u64 {
    let (bytes, count) = (known.iter()).fold((0u64, 0usize), |(b, c), &(kb, kc)| (b + kb, c + kc));
    if count == 0 {
        0
    } else {
        bytes / count as u64 * samples as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(bytes: u64, ms: u64) -> Progress {
        Progress {
            bytes,
            elapsed: Duration::from_millis(ms),
            done: bytes,
            took: Some(Duration::from_millis(ms)),
            rated: true,
        }
    }

    fn pending(bytes: u64) -> Progress {
        Progress {
            bytes,
            done: 0,
            elapsed: Duration::ZERO,
            took: None,
            rated: true,
        }
    }

    /// The streams as seen `secs` after they started.
    fn at(rule: &SlowPeers, secs: u64, streams: &[Progress]) -> Vec<bool> {
        let s: Vec<Progress> = (streams.iter())
            .map(|p| Progress {
                elapsed: Duration::from_secs(secs),
                ..*p
            })
            .collect();
        rule.overdue(&s)
    }

    #[test]
    fn a_stream_by_disk_waits_for_its_size_list_as_long_as_the_slowest_stream() {
        let rule = SlowPeers {
            factor: 2.0,
            grace: Duration::from_secs(1),
            ..SlowPeers::default()
        };
        let disk = Progress {
            bytes: 160,
            done: 0,
            elapsed: Duration::ZERO,
            took: None,
            rated: false,
        };
        let s = [
            done(1 << 30, 2000),
            done(1 << 20, 1000),
            done(1 << 20, 2000),
            disk,
        ];
        assert!(!at(&rule, 4, &s)[3]);
        assert!(at(&rule, 6, &s)[3]);
    }

    #[test]
    fn a_stream_far_behind_the_others_is_overdue() {
        let rule = SlowPeers {
            factor: 4.0,
            grace: Duration::from_secs(1),
            ..SlowPeers::default()
        };
        // Three peers at 100 MB/s took 1 s each; the fourth has as many bytes.
        let s = [
            done(100 << 20, 1000),
            done(100 << 20, 1000),
            done(100 << 20, 1000),
            pending(100 << 20),
        ];
        let at = |secs| at(&rule, secs, &s);
        assert_eq!(at(4), vec![false; 4], "within 4 x 1 s + 1 s");
        assert_eq!(at(6), vec![false, false, false, true]);
    }

    /// Uneven finishes on one shared link (what the slow rank itself sees) give nobody up.
    #[test]
    fn streams_sharing_a_slow_link_unevenly_are_not_overdue() {
        let rule = SlowPeers {
            factor: 3.0,
            grace: Duration::from_millis(300),
            ..SlowPeers::default()
        };
        let mb = 1 << 20;
        let s = [
            done(5 * mb / 2, 1100),
            done(5 * mb / 2, 2900),
            pending(5 * mb / 2),
        ];
        assert_eq!(at(&rule, 4, &s), vec![false; 3]);
    }

    #[test]
    fn no_verdict_before_half_the_streams_are_in_or_when_disabled() {
        let rule = SlowPeers::default();
        let s = [done(1 << 20, 10), pending(1 << 20), pending(1 << 20)];
        assert_eq!(at(&rule, 100, &s), vec![false; 3]);
        let s = [done(1 << 20, 10), done(1 << 20, 10), pending(1 << 20)];
        assert_eq!(at(&rule, 100, &s), vec![false, false, true]);
        let off = SlowPeers {
            factor: 0.0,
            ..rule
        };
        assert_eq!(at(&off, 100, &s), vec![false; 3]);
    }

    #[test]
    fn an_empty_stream_waits_only_the_grace() {
        let rule = SlowPeers::default();
        let s = [done(1 << 20, 10), pending(0)];
        assert_eq!(at(&rule, 1, &s), vec![false, false]);
        assert_eq!(at(&rule, 3, &s), vec![false, true]);
    }

    /// A stream that shows a hundredth of the others' rate is overdue as soon as the
    /// others are in; one at half their rate is not.
    #[test]
    fn a_stream_is_judged_by_its_projected_time() {
        let rule = SlowPeers::default();
        let mb = 1 << 20;
        let with = |done| Progress {
            done,
            elapsed: Duration::from_millis(1200),
            ..pending(100 * mb)
        };
        let s = [
            done(100 * mb, 1000),
            done(100 * mb, 1100),
            with(mb),
            with(60 * mb),
        ];
        assert_eq!(rule.overdue(&s), vec![false, false, true, false]);
    }

    /// On a small exchange the grace does not set the deadline of a stream that shows its
    /// rate: streams of 0.3 s give up one at a twentieth of their rate once half a second
    /// (a quarter of the grace) went by, not 2 s later.
    #[test]
    fn a_small_exchange_is_not_dominated_by_the_grace() {
        let rule = SlowPeers::default();
        let mb = 1 << 20;
        let slow = |ms| Progress {
            done: 6 * mb * ms / 300 / 20,
            elapsed: Duration::from_millis(ms),
            ..pending(6 * mb)
        };
        let s = [done(6 * mb, 300), done(6 * mb, 300), slow(400)];
        assert_eq!(rule.overdue(&s), vec![false; 3]);
        let s = [done(6 * mb, 300), done(6 * mb, 300), slow(600)];
        assert_eq!(rule.overdue(&s), vec![false, false, true]);
    }

    #[test]
    fn estimates_use_the_mean_known_size() {
        assert_eq!(estimate(10, &[(1000, 5), (3000, 5)]), 4000);
        assert_eq!(estimate(10, &[]), 0);
    }
}
