//! What one rank's own part of the plan costs at scale: its epoch-0 share, one
//! epoch's plan step (its sends, who sends to it, and naming what arrives: told by the
//! senders, or walked back), and a resume (its share at epoch E from nothing but the plan), against
//! the whole job's step that every rank computed before `plan::local`; then a resume from
//! the share the rank saved (`cache::slots`: writing it, reading it back) against that
//! walk-back; and one rank's part of an elastic remap (`Rechunk`: where each position of its
//! new chunk was before the change); and the partial cache's planner of one rank against
//! the whole job's it replaces.
//!
//! The step is shown twice: as the daemon runs it, its arrivals named by their senders
//! (`exchange::arrivals`: "told"), and with them named by walking the plan back
//! (`Plan::walked`, the fallback where a peer cannot tell, and what a step cost before).
//!
//! One rank's real code (`plan::local::LocalPlan`, what `Plan::own_*` run in the daemon);
//! the other ranks are not run: the per-rank plan never needs their shares, so nothing of
//! the plan is modelled. What this leaves out: the manifest (mapped once per host, not
//! per rank), the exchange's bytes and its two small rounds for a partial cache
//! (`exchange::kept`), and `--equal-shares drop` (still the whole job's).
//!
//! `cargo bench --bench scale` (release): N = 10^8 at M = 8 and 64, resume at epoch 10;
//! `SCALE_BIG=1` adds N = 5·10^9, M = 4,096, resume at epoch 90 (`SCALE_ONLY_BIG=1`: that row
//! alone). Q = 0.3. CPU seconds are
//! the process's user+system time over the call (the resume runs on every core); peak RSS
//! is the process's so far (`VmHWM`), so read each row's memory as "at most".
//!
//! Results are in docs/performance.md ("Per-rank plan at scale").

use std::time::Instant;

use shufflefs::plan::local::{LocalParams, LocalPlan, Rechunk};
use std::collections::BTreeMap;

use shufflefs::plan::{EpochShares, Plan, PlanParams};

const Q: f64 = 0.3;

/// Process CPU seconds (user + system) so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line (11 and 12 after the name).
    (ticks(11) + ticks(12)) / 100.0
}

/// Wall and CPU seconds of `f`.
fn measure<T>(f: impl FnOnce() -> T) -> (f64, f64, T) {
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    let v = f();
    (wall.elapsed().as_secs_f64(), cpu_seconds() - cpu, v)
}

/// This process's `field` of `/proc/self/status` (a kB figure), in MiB.
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = (status.lines())
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Peak resident MiB so far (`VmHWM`).
fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// The whole job's plan of `n` samples on `m` ranks (what the rows measure against).
fn plan_of(n: u64, m: u32) -> Plan {
    Plan::new(PlanParams {
        samples: n,
        world: m,
        fraction: Q,
        seed: 7,
    })
    .expect("valid")
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Saving one rank's share at `epoch` (`cache::slots`, what the daemon writes each epoch)
/// and reading it back as a resume does (read, checksum, sorted copy):
/// `(write wall s, read wall s, read CPU s, bytes)`.
fn saved_share(n: u64, m: u32, me: u32, epoch: u64, slots: &[u64]) -> (f64, f64, f64, u64) {
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let key = shufflefs::cache::slots::SlotsKey {
        epoch,
        rank: me,
        world: m,
        samples: n,
        seed: 7,
        fraction_bits: Q.to_bits(),
        plan: 0,
    };
    let (write, _, saved) = measure(|| shufflefs::cache::slots::save(tmp.path(), &key, slots));
    saved.expect("saved");
    let (read, read_cpu, back) = measure(|| {
        let back = shufflefs::cache::slots::load(tmp.path(), &key).expect("read back");
        let mut share = back.clone();
        share.sort_unstable();
        back
    });
    assert_eq!(back, slots, "the saved share reads back");
    let file = tmp
        .path()
        .join(shufflefs::cache::slots::SLOTS)
        .join(format!("{epoch}.bin"));
    let bytes = std::fs::metadata(file).map_or(0, |m| m.len());
    (write, read, read_cpu, bytes)
}

/// One rank (the middle one): epoch 0, the step out of `epoch`, a resume at `epoch`; and
/// the resume from its saved share (returned as a row of the second table).
fn per_rank(n: u64, m: u32, epoch: u64) -> String {
    let plan = LocalPlan::new(LocalParams::new(n, m, Q, 7).expect("valid"), None);
    let me = m / 2;
    let (deal, _, initial) = measure(|| plan.initial_slots(me));
    let (resume_wall, resume_cpu, slots) = measure(|| plan.slots_at(epoch, me, threads()));
    let (step_wall, step_cpu, step) = measure(|| {
        let step = plan.step(epoch, me, &slots);
        let sources: Vec<u64> = step
            .receives
            .iter()
            .map(|r| plan.source(epoch, r))
            .collect();
        let arrived = plan.ids_at(epoch, &sources, 1);
        (step, arrived)
    });
    let told = told_step(n, m, epoch, &slots, &step);
    println!(
        "| per rank | {n:>13} | {m:>5} | {:>9} | {deal:>6.3} | {epoch:>3} | {told:>6.3} | {step_wall:>6.3} | {step_cpu:>6.2} | {resume_wall:>7.2} | {resume_cpu:>7.2} | {:>8} | {:>7.0} |",
        initial.len(),
        step.0.sends.len(),
        peak_rss_mib()
    );
    let (write, read, read_cpu, bytes) = saved_share(n, m, me, epoch, &slots);
    format!(
        "| {n:>13} | {m:>5} | {:>9} | {epoch:>3} | {bytes:>10} | {write:>6.3} | {read:>6.3} | {read_cpu:>6.3} | {resume_wall:>7.2} | {resume_cpu:>7.2} |",
        slots.len()
    )
}

/// The step as a daemon runs it (`exchange::arrivals`): its own part (`Plan::own_unnamed`,
/// O(k)), the lists it tells its receivers (encoded), the lists its senders told it
/// (decoded; given here by `walked`: the walk's names in slot order, what the senders
/// hold) checked and made its next share. CPU seconds; the round's wait for the slowest
/// peer is left out (it overlaps the reading of the epoch, as the exchange does).
fn told_step(
    n: u64,
    m: u32,
    epoch: u64,
    slots: &[u64],
    walked: &(shufflefs::plan::local::LocalStep, Vec<u64>),
) -> f64 {
    let plan = plan_of(n, m);
    let me = m / 2;
    let mut all = vec![Vec::new(); m as usize];
    all[me as usize] = slots.to_vec();
    let cur = std::sync::Arc::new(EpochShares::from_slots(epoch, all));
    let mut heard: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    for (r, id) in walked.0.receives.iter().zip(&walked.1) {
        heard.entry(r.from).or_default().extend(id.to_le_bytes());
    }
    let (_, cpu, step) = measure(|| {
        let unnamed = plan.own_unnamed(me, &cur).expect("a per-rank plan");
        let out: Vec<(u32, Vec<u8>)> = (unnamed.told().into_iter())
            .map(|(to, ids)| (to, ids.iter().flat_map(|id| id.to_le_bytes()).collect()))
            .collect();
        let lists = (heard.iter())
            .map(|(&from, b)| {
                let ids = b
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()));
                (from, ids.collect())
            })
            .collect();
        let step = unnamed.named(&lists).expect("the walk's names fit");
        (step, out.len())
    });
    let (step, _) = step;
    assert_eq!(step.next.share(me).len(), slots.len());
    cpu
}

/// One rank's part of an elastic restart `m -> m2` (`plan::local::Rechunk`): the remap's
/// prefix sums, then where each position of the middle rank's new chunk was before (what a
/// walk back across the change does once per position).
fn remap_row(n: u64, m: u32, m2: u32) -> String {
    let (old, new) = (
        LocalParams::new(n, m, Q, 7).expect("valid"),
        LocalParams::new(n, m2, Q, 7).expect("valid"),
    );
    let (build, _, rechunk) = measure(|| Rechunk::new(old, new, 45));
    // Shrinking: a survivor that grows; growing: the last new rank (all of it dealt).
    let me = if m2 < m { m2 / 2 } else { m2 - 1 };
    let (map, map_cpu, moved) = measure(|| {
        let chunk = new.chunk(me);
        let own = old.chunk(me);
        (chunk.map(|q| rechunk.old_of(q)))
            .filter(|p| !own.contains(p))
            .count()
    });
    let share = new.chunk(me).end - new.chunk(me).start;
    format!(
        "| {n:>13} | {m:>5} -> {m2:<5} | {me:>5} | {share:>9} | {moved:>9} | {:>7.3} | {map:>6.3} | {map_cpu:>6.2} | {:>7.0} |",
        build * 1e3,
        peak_rss_mib()
    )
}

/// The whole job's plan (what every rank computed before): epoch 0 and one step.
fn whole_job(n: u64, m: u32) {
    let plan = plan_of(n, m);
    let (deal, _, shares) = measure(|| plan.initial());
    let (step_wall, step_cpu, s) = measure(|| plan.step(&shares));
    let sent = s.transfers.iter().filter(|t| t.from == m / 2).count();
    println!(
        "| whole job | {n:>13} | {m:>5} | {:>9} | {deal:>6.3} | 0 | | {step_wall:>6.3} | {step_cpu:>6.2} | | | {sent:>8} | {:>7.0} |",
        shares.share(m / 2).len(),
        peak_rss_mib()
    );
}

/// Resident MiB now (`VmRSS`): what a structure still alive holds.
fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

/// The partial cache's planner of one rank (`LocalKeep`: its own shares over the horizon,
/// built and stepped once) against the whole job's (`KeepPlanner`, every rank's, what each
/// daemon built before), at a room of half a share: resident MiB each holds, and seconds.
fn keep_planners(n: u64, m: u32) {
    use shufflefs::plan::keep::{DEFAULT_HORIZON, KeepPlanner};
    use shufflefs::plan::keep_local::{LocalKeep, SizeOf};
    let plan = plan_of(n, m);
    let me = m / 2;
    let size = |s: u64| 50_000 + s % 100_000;
    let cap = n / u64::from(m) * 100_000 / 2;
    let before = rss_mib();
    let (built, _, mut local) = measure(|| {
        let sized: SizeOf = std::sync::Arc::new(size);
        let start = plan.own_initial(me);
        LocalKeep::new(plan.clone(), me, start, &[], (sized, cap), DEFAULT_HORIZON)
    });
    let (stepped, _, ()) = measure(|| local.advance());
    let held = rss_mib() - before;
    println!(
        "| one rank's (LocalKeep) | {n:>11} | {m:>4} | {:>9} | {built:>7.2} | {stepped:>7.2} | {held:>8.0} |",
        local.share().len()
    );
    drop(local);
    let before = rss_mib();
    let sizes: Vec<u64> = (0..n).map(size).collect();
    let (built, _, mut whole) =
        measure(|| KeepPlanner::new(plan.clone(), sizes, cap, DEFAULT_HORIZON));
    let (stepped, _, ()) = measure(|| whole.advance());
    let held = rss_mib() - before;
    println!(
        "| whole job's (KeepPlanner) | {n:>11} | {m:>4} | {:>9} | {built:>7.2} | {stepped:>7.2} | {held:>8.0} |",
        whole.shares().share(me).len()
    );
}

fn main() {
    // `cargo bench` passes --bench; under `cargo test --all-targets` (a debug build), a smoke
    // run on a thousandth of the samples.
    let scale = match std::env::args().any(|a| a == "--bench") {
        true => 1,
        false => 1000,
    };
    println!(
        "| plan | N | M | share | epoch 0 s | epoch | step CPU s (told) | step wall s (walked) | step CPU s (walked) | resume wall s | resume CPU s | sent | peak RSS MiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let only_big = scale == 1 && std::env::var_os("SCALE_ONLY_BIG").is_some();
    if std::env::var_os("SCALE_ONLY_KEEP").is_some() {
        return keep_table(scale, &[1, 8, 64]);
    }
    let mut saved = Vec::new();
    for m in [8, 64].into_iter().filter(|_| !only_big) {
        saved.push(per_rank(100_000_000 / scale, m, 10));
    }
    for m in [8, 64].into_iter().filter(|_| !only_big) {
        whole_job(10_000_000 / scale as u64, m);
    }
    if only_big || (scale == 1 && std::env::var_os("SCALE_BIG").is_some()) {
        saved.push(per_rank(5_000_000_000, 4096, 90));
    }
    println!();
    println!(
        "| resume from the saved share: N | M | share | epoch | file bytes | write wall s | read wall s | read CPU s | walk-back wall s | walk-back CPU s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in saved {
        println!("{row}");
    }
    println!();
    println!(
        "| elastic remap: N | M -> M' | rank | share | moved in | prefix sums ms | map wall s | map CPU s | peak RSS MiB |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    if !only_big {
        println!("{}", remap_row(100_000_000 / scale, 64, 48));
        println!("{}", remap_row(100_000_000 / scale, 64, 80));
    }
    if only_big || (scale == 1 && std::env::var_os("SCALE_BIG").is_some()) {
        println!("{}", remap_row(5_000_000_000, 4096, 3072));
        println!("{}", remap_row(5_000_000_000, 4096, 5120));
    }
    if only_big {
        return;
    }
    println!();
    keep_table(scale, &[64]);
}

/// The partial cache planners' table at 10^7 samples (`SCALE_ONLY_KEEP=1` alone, for 1, 8
/// and 64 ranks).
fn keep_table(scale: u64, ranks: &[u32]) {
    println!("| partial cache planner | N | M | share | build s | advance s | resident MiB |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for &m in ranks {
        keep_planners(10_000_000 / scale, m);
    }
}
