//! `shufflefs plan`: what a shuffle costs before any run, measured on seeded random
//! placements ([`placement`](crate::plan::placement)) with Theorems 1 and 2 beside the counts.
//!
//! Costs are in samples of a fixed size (`--sample-bytes`), as in the paper: a coded packet
//! is as long as one sample. The server model has compute ranks that only receive; a
//! multicast packet counts once for the server and once for every rank of its group. With
//! `--fraction` the calculator also prints what today's partial-local exchange moves (no
//! server; ranks send to each other) and compares the coded schemes at the same storage.

use std::fmt::Write;

use super::groups::{Communicators, DEFAULT_LIMIT, GroupsError, group_mask, route_all};
use super::{Scheme, next_instance, plan};
use crate::plan::placement::{PlacementError, RandomPlacement};
use crate::plan::{Plan, PlanError, PlanParams};

/// How much each rank stores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Storage {
    /// Partial-local `--fraction Q`: each rank keeps up to `(1 + Q)` times its share.
    Fraction(f64),
    /// Coded shuffling's `alpha`: each rank caches `floor(alpha * q)` samples.
    CacheFraction(f64),
}

/// Everything the calculator needs; the CLI fills it from `shufflefs plan`'s flags.
#[derive(Clone, Debug, PartialEq)]
pub struct CalcInput {
    pub samples: u64,
    pub ranks: usize,
    pub storage: Storage,
    pub schemes: Vec<Scheme>,
    pub seed: u64,
    pub sample_bytes: u64,
    /// Seeded epochs averaged over.
    pub epochs: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum CalcError {
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("--samples must be at least --ranks ({ranks})")]
    TooFewSamples { ranks: usize },
    #[error("--epochs must be at least 1")]
    NoEpochs,
    #[error(transparent)]
    Groups(#[from] GroupsError),
}

/// Theorem 1: uncoded transmissions per epoch, `q (1 - s/q)`.
pub fn theorem1(q: f64, s: f64) -> f64 {
    q * (1.0 - s / q)
}

/// Theorem 2 (large `q`): coded broadcasts per epoch,
/// `sum_{i=2..n} C(n,i) (q/n) ((i-1)/n) p^(i-2) (1-p)^(n-i+1)` with
/// `p = (s - q/n) / (q - q/n)`, summed term by term as in the proof.
pub fn theorem2(q: f64, n: usize, s: f64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let nf = n as f64;
    let p = (s - q / nf) / (q - q / nf);
    let mut binom = nf; // C(n, 1)
    let mut total = 0.0;
    for i in 2..=n {
        binom = binom * (nf - i as f64 + 1.0) / i as f64;
        let i_f = i as f64;
        total += binom
            * (q / nf)
            * ((i_f - 1.0) / nf)
            * p.powi(i as i32 - 2)
            * (1.0 - p).powi((n - i + 1) as i32);
    }
    total
}

/// Averages over `epochs` seeded epochs for one scheme.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct SchemeCost {
    /// Packets the server sends.
    pub transmissions: f64,
    /// Packets each rank receives (its multicast groups), averaged over ranks.
    pub received_per_rank: f64,
}

/// Measures `scheme` on `epochs` consecutive epochs of a seeded placement.
pub(crate) fn measure(
    samples: u64,
    ranks: usize,
    alpha: f64,
    seed: u64,
    epochs: u32,
    scheme: Scheme,
) -> Result<SchemeCost, CalcError> {
    let mut placement = RandomPlacement::new(samples, ranks, alpha, seed)?;
    let mut cost = SchemeCost::default();
    for _ in 0..epochs {
        let txs = plan(&next_instance(&mut placement), scheme);
        cost.transmissions += txs.len() as f64;
        cost.received_per_rank += txs.iter().map(|t| t.group.len()).sum::<usize>() as f64;
    }
    cost.transmissions /= f64::from(epochs);
    cost.received_per_rank /= f64::from(epochs) * ranks as f64;
    Ok(cost)
}

/// The calculator's whole report, as `shufflefs plan` prints it.
pub fn report(input: &CalcInput) -> Result<String, CalcError> {
    let (q, n, b) = (input.samples, input.ranks, input.sample_bytes);
    if input.epochs == 0 {
        return Err(CalcError::NoEpochs);
    }
    if (q as usize) < n || n == 0 {
        return Err(CalcError::TooFewSamples { ranks: n });
    }
    let share = q as usize / n;
    let mut out = String::new();
    let w = &mut out;
    let alpha = match input.storage {
        Storage::CacheFraction(a) => a,
        Storage::Fraction(frac) => partial_local(w, input, frac)?,
    };
    let s = RandomPlacement::new(q, n, alpha, input.seed)?.cache_size();
    let missing = theorem1(q as f64, s as f64) / n as f64;
    let _ = writeln!(
        w,
        "server rank holds all {q} samples ({}); {n} compute ranks cache s = floor(alpha q) = {s} samples each ({}), alpha = {alpha:.4}",
        bytes(q * b),
        bytes(s as u64 * b)
    );
    let _ = writeln!(
        w,
        "each epoch every rank gets a fresh random share of {share} samples and lacks about {missing:.1} of them (Theorem 1 / n); seed {}, averaged over {} epochs, {} per sample",
        input.seed,
        input.epochs,
        bytes(b)
    );
    scheme_table(w, input, alpha, s)?;
    multicast_note(w, input, alpha)?;
    let _ = writeln!(
        w,
        "theory: T1 = Theorem 1 (uncoded, exact in expectation), T2 = Theorem 2 (coded, reached only as q -> infinity); ubershuffle has no closed form and never needs more packets than coded on the same placement. The server receives nothing; compute ranks send nothing."
    );
    let _ = writeln!(
        w,
        "to run it: mpirun -np 1 shufflefs serve --source SRC : -np M shufflefs mount --exchange coded --cache-fraction ALPHA --scheme S ... (README \"Coded shuffling\")."
    );
    Ok(out)
}

/// The report's part on today's partial-local exchange at `--fraction frac`; returns the
/// cache fraction that stores as much, at which the coded schemes are compared.
fn partial_local(w: &mut String, input: &CalcInput, frac: f64) -> Result<f64, CalcError> {
    let (q, n, b) = (input.samples, input.ranks, input.sample_bytes);
    let plan = Plan::new(PlanParams {
        samples: q,
        world: n as u32,
        fraction: frac,
        seed: input.seed,
    })?;
    let moved = plan.exchange_count();
    let stored = (q as usize).div_ceil(n) + moved;
    let _ = writeln!(
        w,
        "partial-local (--fraction {frac}, today's mount): no server, ranks exchange directly"
    );
    let _ = writeln!(
        w,
        "  storage per rank: up to {stored} samples ({})",
        bytes(stored as u64 * b)
    );
    let _ = writeln!(
        w,
        "  per epoch each rank sends {moved} and receives {moved} samples ({} each way); all ranks together move {} samples ({})",
        bytes(moved as u64 * b),
        moved * n,
        bytes((moved * n) as u64 * b)
    );
    let _ = writeln!(
        w,
        "coded schemes at the same storage (alpha = {stored}/{q}), full reshuffle every epoch:"
    );
    Ok(stored as f64 / q as f64)
}

/// The table of measured costs, one line per scheme (`s`: samples each rank caches).
fn scheme_table(w: &mut String, input: &CalcInput, alpha: f64, s: usize) -> Result<(), CalcError> {
    let (q, n, b) = (input.samples, input.ranks, input.sample_bytes);
    let qf = q as f64;
    let _ = writeln!(
        w,
        "{:<18} {:>14} {:>12} {:>16} {:>20} {:>11}",
        "scheme", "transmissions", "theory", "server sends", "each rank receives", "ranks send"
    );
    for &scheme in &input.schemes {
        let c = measure(q, n, alpha, input.seed, input.epochs, scheme)?;
        let theory = match scheme {
            Scheme::Uncoded => format!("T1 {:.1}", theorem1(qf, s as f64)),
            Scheme::Coded => format!("T2 {:.1}", theorem2(qf, n, s as f64)),
            Scheme::Ubershuffle { .. } => "-".to_owned(),
        };
        let name = match scheme {
            Scheme::Ubershuffle { nu } => format!("ubershuffle(nu={nu})"),
            other => other.name().to_owned(),
        };
        let _ = writeln!(
            w,
            "{name:<18} {:>14.1} {theory:>12} {:>16} {:>20} {:>11}",
            c.transmissions,
            bytes((c.transmissions * b as f64) as u64),
            format!(
                "{:.1} ({})",
                c.received_per_rank,
                bytes((c.received_per_rank * b as f64) as u64)
            ),
            "0"
        );
    }
    Ok(())
}

/// The line on the multicast communicators of the last coded scheme asked for (none for a
/// single rank or uncoded only).
fn multicast_note(w: &mut String, input: &CalcInput, alpha: f64) -> Result<(), CalcError> {
    let (q, n, b) = (input.samples, input.ranks, input.sample_bytes);
    let coded = input.schemes.iter().rev().find(|s| **s != Scheme::Uncoded);
    let Some(&scheme) = coded.filter(|_| n >= 2) else {
        return Ok(());
    };
    let comms = Communicators::for_cache(n, DEFAULT_LIMIT, alpha)?;
    let inst = next_instance(&mut RandomPlacement::new(q, n, alpha, input.seed)?);
    let txs = plan(&inst, scheme);
    let (_, merge) = route_all(&comms, txs.iter().map(|t| (group_mask(t), b)))?;
    let _ = writeln!(
        w,
        "multicast: {} MPI communicators (limit {DEFAULT_LIMIT}; {}); with {}, ranks in a packet's communicator that are not its receivers also get it: {:.2} extra receptions per needed one (epoch 1, not counted in the table above)",
        comms.len(),
        match comms.exact_upto() {
            k if k >= n => "one per group".to_owned(),
            k if k < 2 => format!(
                "groups merged into unions of {} blocks of ranks",
                comms.blocks().len()
            ),
            k => format!(
                "groups of up to {k} ranks exact, larger ones merged into unions of {} blocks",
                comms.blocks().len()
            ),
        },
        scheme.name(),
        merge.extra_ratio()
    );
    Ok(())
}

/// `12.3 MB`-style sizes (decimal units).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
