//! A share larger than the cache: hit rate and bytes from the source per epoch
//! for the planned kept sets (`plan::keep`), the clairvoyant bound for the same cache size,
//! and an LRU cache of the same size, on the same plan and the same reads.
//!
//! Every rank reads its share once per epoch in a seeded random order (the loader's
//! shuffle). Sample sizes are seeded, 64..192 KiB. The three policies per rank:
//! * **planned**: the kept sets of `KeepPlanner` (hits: kept the epoch before and still in
//!   the share, or received from a peer that kept it).
//! * **+early**: the same with the daemon's early refill (`cache::early`): a kept sample that
//!   leaves after the epoch frees its room once read, and the next epoch's new kept samples
//!   already on the rank are written when read after that, if they fit.
//! * **bound**: Belady's MIN with bypass over the rank's reads, given every future read:
//!   after a read (or when a sample arrives through the exchange, at the epoch boundary, as
//!   if its sender always had it: free), the sample is cached if room can be made by
//!   evicting only samples read again later than it; else it is not cached. Exact optimum
//!   for equal sizes; with sizes it is the size-aware MIN (close to, not provably, optimal).
//! * **lru**: an LRU cache of the same bytes in front of the source, filled on misses.
//!
//! `hit` is a read with no source read for it that epoch; `src MB` the bytes from the
//! source per epoch, summed over ranks. Epoch 0 starts cold for all.
//!
//! `cargo bench --bench partial_cache` (seconds). Last results, 2-core VM: see
//! docs/partial-cache.md.

use std::collections::{BTreeSet, HashMap};

use lru::LruCache;
use shufflefs::plan::keep::{DEFAULT_HORIZON, KeepPlanner};
use shufflefs::plan::{Plan, PlanParams, SampleId};

const WORLD: u32 = 4;
const FRACTION: f64 = 0.3;
const EPOCHS: u64 = 5;

/// A small deterministic generator (splitmix64): the bench needs no statistical quality.
struct Mix(u64);
impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Per epoch and policy, summed over ranks.
#[derive(Clone, Copy, Default)]
struct Row {
    reads: u64,
    hits: u64,
    source: u64,
}

/// The reads of one rank: per epoch, its share in a seeded order, and the samples that
/// arrived at that epoch.
struct Reads {
    epochs: Vec<Vec<SampleId>>,
    arrivals: Vec<Vec<SampleId>>,
}

fn reads(plan: &Plan, rank: u32, seed: u64) -> Reads {
    let mut rng = Mix(seed ^ u64::from(rank) << 32);
    let mut cur = plan.initial();
    let (mut epochs, mut arrivals) = (Vec::new(), Vec::new());
    let mut before: Vec<SampleId> = Vec::new();
    for _ in 0..EPOCHS {
        let mut order = cur.share(rank).to_vec();
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let share = cur.share(rank);
        arrivals.push(
            (share.iter().copied())
                .filter(|s| !before.is_empty() && before.binary_search(s).is_err())
                .collect(),
        );
        before = share.to_vec();
        epochs.push(order);
        cur = plan.step(&cur).next;
    }
    Reads { epochs, arrivals }
}

/// The cache of Belady's MIN: samples by their next read.
struct Min<'a> {
    sizes: &'a [u64],
    cap: u64,
    used: u64,
    by_next: BTreeSet<(usize, SampleId)>,
    next_of: HashMap<SampleId, usize>,
}

impl Min<'_> {
    fn holds(&self, s: SampleId) -> bool {
        self.next_of.contains_key(&s)
    }

    /// `s` may be cached; its next read is `next` (`None`: never again).
    fn offer(&mut self, s: SampleId, next: Option<usize>) {
        if let Some(old) = self.next_of.remove(&s) {
            self.by_next.remove(&(old, s));
            self.used -= self.sizes[s as usize];
        }
        let Some(n) = next else { return };
        let need = self.sizes[s as usize];
        let mut free = self.cap - self.used;
        let mut victims = Vec::new();
        for &v in self.by_next.iter().rev() {
            if free >= need || v.0 <= n {
                break;
            }
            free += self.sizes[v.1 as usize];
            victims.push(v);
        }
        if free < need {
            return;
        }
        for v in victims {
            self.by_next.remove(&v);
            self.next_of.remove(&v.1);
            self.used -= self.sizes[v.1 as usize];
        }
        self.by_next.insert((n, s));
        self.next_of.insert(s, n);
        self.used += need;
    }
}

/// Belady's MIN with bypass and free arrivals (see the module docs).
fn bound(r: &Reads, sizes: &[u64], cap: u64) -> Vec<Row> {
    // Per sample, the positions of its reads in the whole sequence.
    let mut at: HashMap<SampleId, Vec<usize>> = HashMap::new();
    let mut t = 0usize;
    for e in &r.epochs {
        for &s in e {
            at.entry(s).or_default().push(t);
            t += 1;
        }
    }
    let next_from = |s: SampleId, t: usize| -> Option<usize> {
        let v = &at[&s];
        v.get(v.partition_point(|&x| x < t)).copied()
    };
    let mut min = Min {
        sizes,
        cap,
        used: 0,
        by_next: BTreeSet::new(),
        next_of: HashMap::new(),
    };
    let mut rows = Vec::new();
    let mut t = 0usize;
    for (e, order) in r.epochs.iter().enumerate() {
        for &s in &r.arrivals[e] {
            // Offered just before the epoch's first read.
            min.offer(s, next_from(s, t));
        }
        let mut row = Row::default();
        for &s in order {
            row.reads += 1;
            if min.holds(s) {
                row.hits += 1;
            } else {
                row.source += sizes[s as usize];
            }
            min.offer(s, next_from(s, t + 1));
            t += 1;
        }
        rows.push(row);
    }
    rows
}

/// An LRU cache of `cap` bytes in front of the source, filled on misses.
fn lru(r: &Reads, sizes: &[u64], cap: u64) -> Vec<Row> {
    let mut cache: LruCache<SampleId, ()> = LruCache::unbounded();
    let mut used = 0u64;
    let mut rows = Vec::new();
    for order in &r.epochs {
        let mut row = Row::default();
        for &s in order {
            row.reads += 1;
            if cache.get(&s).is_some() {
                row.hits += 1;
                continue;
            }
            row.source += sizes[s as usize];
            cache.put(s, ());
            used += sizes[s as usize];
            while used > cap {
                let (old, ()) = cache.pop_lru().expect("over capacity, so not empty");
                used -= sizes[old as usize];
            }
        }
        rows.push(row);
    }
    rows
}

fn run(samples: u64, times: u64) {
    let plan = Plan::new(PlanParams {
        samples,
        world: WORLD,
        fraction: FRACTION,
        seed: 42,
    })
    .expect("valid plan");
    let mut rng = Mix(7);
    let sizes: Vec<u64> = (0..samples)
        .map(|_| (64 + rng.next() % 128) << 10)
        .collect();
    let share_bytes: u64 = sizes.iter().sum::<u64>() / u64::from(WORLD);
    let cap = share_bytes / times;
    let mut planned = KeepPlanner::new(plan.clone(), sizes.clone(), cap, DEFAULT_HORIZON);
    let per_rank: Vec<Reads> = (0..WORLD).map(|r| reads(&plan, r, 11)).collect();
    let sum = |f: &dyn Fn(&Reads) -> Vec<Row>| -> Vec<Row> {
        let mut total = vec![Row::default(); EPOCHS as usize];
        for r in &per_rank {
            for (t, x) in total.iter_mut().zip(f(r)) {
                t.reads += x.reads;
                t.hits += x.hits;
                t.source += x.source;
            }
        }
        total
    };
    let b = sum(&|r| bound(r, &sizes, cap));
    let l = sum(&|r| lru(r, &sizes, cap));
    println!(
        "\nshare {:.0} MB per rank = {times}x the cache ({:.0} MB); {WORLD} ranks, Q {FRACTION}, {samples} samples",
        share_bytes as f64 / 1e6,
        cap as f64 / 1e6
    );
    println!(
        "| epoch | planned hit | +early hit | bound hit | lru hit | planned src MB | +early src MB | bound src MB | lru src MB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let pct = |a: u64, b: u64| 100.0 * a as f64 / b.max(1) as f64;
    // What the early refill made cached for the epoch after (hits, bytes).
    let mut early = (0u64, 0u64);
    for e in 0..EPOCHS as usize {
        if e > 0 {
            planned.advance();
        }
        let p = (0..WORLD).fold(
            Default::default(),
            |acc: shufflefs::plan::keep::Outcome, r| acc.add(&planned.outcome_of(r)),
        );
        println!(
            "| {e} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.0} | {:.0} | {:.0} | {:.0} |",
            pct(p.hits, p.reads),
            pct(p.hits + early.0, p.reads),
            pct(b[e].hits, b[e].reads),
            pct(l[e].hits, l[e].reads),
            p.source_bytes as f64 / 1e6,
            (p.source_bytes - early.1) as f64 / 1e6,
            b[e].source as f64 / 1e6,
            l[e].source as f64 / 1e6,
        );
        early = (0..WORLD)
            .map(|r| early_refill(&planned, &plan, &per_rank[r as usize].epochs[e], r, &sizes))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    }
}

/// The early refill (`cache::early`) of `rank` during the planner's epoch, read in `order`:
/// once the exchange is done (taken as at the epoch's start), each kept sample leaving after
/// the epoch frees its room when read, and the next epoch's new kept samples already here
/// are written when read, if they fit. Returns the samples and bytes so cached a epoch early.
fn early_refill(
    p: &KeepPlanner,
    plan: &Plan,
    order: &[SampleId],
    rank: u32,
    sizes: &[u64],
) -> (u64, u64) {
    let moved = p.exchanged(&plan.step(p.shares()));
    let mut next = p.clone();
    next.advance();
    let (kept, next_kept) = (p.kept(rank), next.kept(rank));
    let next_share = next.shares().share(rank);
    let size = |s: &SampleId| sizes[*s as usize];
    let received: u64 = moved
        .iter()
        .filter(|t| t.to == rank)
        .map(|t| size(&t.sample))
        .sum();
    let mut room = p
        .capacity()
        .saturating_sub(kept.iter().map(size).sum::<u64>() + received);
    let (mut n, mut bytes) = (0, 0);
    for s in order {
        let is_kept = kept.binary_search(s).is_ok();
        if is_kept && next_share.binary_search(s).is_err() {
            room += size(s);
        } else if !is_kept && next_kept.binary_search(s).is_ok() && size(s) <= room {
            room -= size(s);
            n += 1;
            bytes += size(s);
        }
    }
    (n, bytes)
}

fn main() {
    // Under `cargo test --all-targets` (no --bench): a smaller smoke run.
    let samples = if std::env::args().any(|a| a == "--bench") {
        20_000
    } else {
        800
    };
    for times in [2, 5] {
        run(samples, times);
    }
}
