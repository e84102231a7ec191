//! What the plan side of an elastic restart costs at start-up: walking the plan to the epoch
//! resumed at, with and without a change of world size on the way, and the remap alone.
//! Pure CPU, one thread, fixed seeds; the data movement of a resize is the exchange's (see
//! `exchange_mpi`) and the disk's.
//!
//! These are the whole job's walks (`ElasticPlan::shares_at`: tests, equal shares, the partial
//! cache's planner); a daemon walks its own share back instead (`benches/scale`'s remap rows).
//!
//! `cargo bench --bench elastic_plan` (release). Last results, 2-core VM shared with other
//! builds (load ~35, so timings are loose), 1 M samples, Q = 0.3, best of 5, with the remap on
//! positions (`plan::local::Rechunk`):
//!
//! | what                                                  | seconds |
//! |-------------------------------------------------------|---------|
//! | walk to epoch 10, 8 ranks                             | 0.772   |
//! | walk to epoch 10, 8 -> 6 at epoch 5                   | 0.960   |
//! | remap 8 -> 6 alone (750000 kept, 250000 moved)        | 0.066   |
//!
//! A resized history costs about what a plain one does to walk (the remap is one pass over
//! the positions, O(log M) each), so a restart's start-up stays what a resume's is.

use std::time::Instant;

use shufflefs::plan::elastic::{ElasticPlan, History, remap};
use shufflefs::plan::{Plan, PlanParams};

const SAMPLES: u64 = 1_000_000;
const RUNS: usize = 5;

fn best(mut f: impl FnMut()) -> f64 {
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    // `cargo bench` passes --bench; under `cargo test --all-targets` (a debug build), a smoke
    // run on a thousandth of the samples.
    let full = std::env::args().any(|a| a == "--bench");
    let params = PlanParams {
        samples: if full { SAMPLES } else { SAMPLES / 1000 },
        world: 8,
        fraction: 0.3,
        seed: 42,
    };
    let plain = Plan::new(params).unwrap();
    let walk = best(|| {
        std::hint::black_box(plain.shares_at(10));
    });
    let history = History::new(8).resized(5, 6).unwrap();
    let elastic = ElasticPlan::new(params, history).unwrap();
    let walk_resized = best(|| {
        std::hint::black_box(elastic.shares_at(10));
    });
    let at5 = plain.shares_at(5);
    let remap_only = best(|| {
        std::hint::black_box(remap(&at5, 6, params.seed));
    });
    let r = remap(&at5, 6, params.seed);
    println!("| what | seconds |");
    println!("|---|---|");
    println!("| walk to epoch 10, 8 ranks | {walk:.3} |");
    println!("| walk to epoch 10, 8 -> 6 at epoch 5 | {walk_resized:.3} |");
    println!(
        "| remap 8 -> 6 alone ({} kept, {} moved) | {remap_only:.3} |",
        r.kept,
        r.transfers.len()
    );
}
