//! How long the job view takes to show a change of every rank's row: the real
//! gather code of every rank (`node::jobview`) in one thread over in-process mailboxes,
//! with the real one-second period. Prints, per job size, the time until rank 0's table
//! holds every rank's new row, until the host leaders just under rank 0 hold them all (the
//! table one level down), the frames rank 0 received per second meanwhile and the ranks it
//! talks to.
//!
//! `cargo bench --bench jobview_refresh [-- RANKS...]` (default 64 512 4096; 8 ranks a host).

use std::time::Duration;

use shufflefs::node::jobview_sim::refresh;

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if args.is_empty() {
        vec![64, 512, 4096]
    } else {
        args
    };
    println!(
        "ranks | per host | rank 0 holds all (s) | first level holds all (s) | frames/s into rank 0 | peers of rank 0"
    );
    for ranks in sizes {
        let r = refresh(ranks, 8, Duration::from_secs(120));
        let first = r.first_level.map_or("over 120".to_string(), |d| {
            format!("{:.1}", d.as_secs_f64())
        });
        println!(
            "{ranks} | 8 | {:.1} | {first} | {:.0} | {}",
            r.rank_0.as_secs_f64(),
            r.rank_0_frames_per_s,
            r.rank_0_peers
        );
    }
}
