//! What one rank's own part of the plan costs (`plan::local`, issue 41), against the whole
//! job's plan that every rank computes today (`Plan::initial` + `Plan::step`, O(N) per rank).
//! One rank's real code; the other ranks are not run (the per-rank plan never needs them),
//! so nothing is modelled. Pure CPU, one thread, Q = 0.3, fixed seed, best of 3.
//!
//! `cargo bench --bench local_plan` (release); `LOCAL_PLAN_BIG=1` adds N = 5·10⁹, M = 4,096
//! (per rank: a share of 1.22 M samples). Peak RSS is the process's so far (`VmHWM`), so
//! read each row's memory as "at most".
//!
//! Last results (2-core VM shared with three builds, 2026-11-29, best of 3):
//!
//! | plan      | N     | M     | share  | epoch 0 s | step s | sent    |
//! |-----------|-------|-------|--------|-----------|--------|---------|
//! | per rank  | 10^7  | 8     | 1.25 M | 0.074     | 0.074  | 328,001 |
//! | per rank  | 10^7  | 64    | 156 k  | 0.011     | 0.006  | 46,136  |
//! | per rank  | 10^8  | 8     | 12.5 M | 1.341     | 0.849  | 3.28 M  |
//! | per rank  | 10^8  | 64    | 1.56 M | 0.161     | 0.055  | 461,255 |
//! | per rank  | 5·10^9| 4,096 | 1.22 M | 0.153     | 0.036  | 366,125 |
//! | whole job | 10^7  | 8     | 1.25 M | 0.293     | 0.272  | 328,494 |
//! | whole job | 10^7  | 64    | 156 k  | 0.290     | 0.265  | 46,107  |
//!
//! The per-rank cost follows the share, not N: at N = 5·10⁹ and M = 4,096 a rank deals its
//! epoch-0 share in 0.15 s and plans a step in 0.04 s; the whole job's plan costs the same
//! for 8 or 64 ranks (it is O(N) on every rank).

use std::time::Instant;

use shufflefs::plan::local::{LocalParams, LocalPlan};
use shufflefs::plan::{Plan, PlanParams};

const Q: f64 = 0.3;
const RUNS: usize = 3;

fn best<T>(mut f: impl FnMut() -> T) -> (f64, T) {
    let mut out = None;
    let mut secs = f64::MAX;
    for _ in 0..RUNS {
        let t = Instant::now();
        let v = f();
        secs = secs.min(t.elapsed().as_secs_f64());
        out = Some(v);
    }
    (secs, out.expect("RUNS > 0"))
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// One rank's epoch-0 share and one step, per-rank plan.
fn local(n: u64, m: u32) {
    let p = LocalPlan::new(LocalParams::new(n, m, Q, 7).expect("valid"), None);
    let (deal, share) = best(|| p.initial_slots(m / 2));
    let (step, s) = best(|| p.step(0, m / 2, &share));
    println!(
        "| per rank | {n:>13} | {m:>5} | {:>9} | {deal:>8.3} | {step:>8.3} | {:>8} | {:>8.0} |",
        share.len(),
        s.sends.len(),
        peak_rss_mib()
    );
}

/// The whole job's plan (what every rank computes today): epoch 0 and one step.
fn global(n: u32, m: u32) {
    let plan = Plan::new(PlanParams {
        samples: n,
        world: m,
        fraction: Q,
        seed: 7,
    })
    .expect("valid");
    let (deal, shares) = best(|| plan.initial());
    let (step, s) = best(|| plan.step(&shares));
    let sent = s.transfers.iter().filter(|t| t.from == m / 2).count();
    println!(
        "| whole job | {n:>13} | {m:>5} | {:>9} | {deal:>8.3} | {step:>8.3} | {sent:>8} | {:>8.0} |",
        shares.share(m / 2).len(),
        peak_rss_mib()
    );
}

fn main() {
    // `cargo bench` passes --bench; under `cargo test --all-targets` (a debug build), a smoke
    // run on a thousandth of the samples.
    let scale = match std::env::args().any(|a| a == "--bench") {
        true => 1,
        false => 1000,
    };
    println!("| plan | N | M | share | epoch 0 s | step s | sent | peak RSS MiB |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for n in [10_000_000, 100_000_000] {
        for m in [8, 64] {
            local(n / scale, m);
        }
    }
    for m in [8, 64] {
        global(10_000_000 / scale as u32, m);
    }
    if scale == 1 && std::env::var_os("LOCAL_PLAN_BIG").is_some() {
        local(5_000_000_000, 4096);
    }
}
