//! Encode and decode speed of coded packets (`shufflefs::coded::packet`), in MB/s of payload.
//!
//! Run: `cargo bench --bench coded_packet` (optimised build, one thread, no I/O: samples are
//! in memory). For each sample size and parts per packet `k` it times
//! * encode: CRC-32C of each part, header, and XOR of the `k` parts into the payload (what the
//!   server does per packet), rate = payload bytes / time;
//! * decode: header check, XOR of the `k - 1` cached parts (each CRC-checked first) out of the
//!   payload and the CRC of the result (what a receiver does), rate = payload bytes / time.
//!
//! So the rates are per packet *sent*; a server sending at 1 Gbit/s (125 MB/s) needs encode
//! well above that to keep its link busy. The XOR alone (`xor`) is reported for reference.
//! `SHUFFLEFS_BENCH_MB` sets the payload volume per case (default 256).
//!
//!
//! A second table shows what zero padding costs on real plans: UberShuffle packets for `n`
//! ranks (q = 20000 samples, alpha = 2/n) with sample sizes drawn from a log-normal of mean
//! 100 KB and coefficient of variation `cv` (0: all equal; ImageNet JPEGs are around 0.5-0.8).
//! `server bytes` is the coded packets' bytes (header and padding included) over the uncoded
//! scheme's bytes for the same epoch, with `plan`'s pairing (by sample id); `by size` the
//! same with `plan_by_size` (longest samples of a set's columns share packets); `packets` is
//! the ratio in packets, what both would be with equal sizes. The gaps are the padding.
//!
//! Last results (this VM, 2 cores shared with other builds, `cargo bench --bench
//! coded_packet`, 2026-11-23): encode 3.6 / 1.9 / 0.9 GB/s and decode 5.3 / 2.1 / 1.1 GB/s
//! for 100 KB samples and k = 2 / 4 / 8 parts; the XOR alone runs at 20-50 GB/s, so the cost
//! is the CRC-32C and the copy of each part, which grow with k. Every case is far above a
//! 1-10 Gbit/s link (125-1250 MB/s) except k = 8 with 1 MB samples against 10 Gbit/s. A
//! second run with the machine's load at 14 (other builds) gave about half of every rate
//! (100 KB: encode 1.8 / 0.8 / 0.4 GB/s, decode 2.1 / 0.9 / 0.5 GB/s).
//! Padding table (deterministic): see `crates/shufflefs-plan/src/coded/packet.rs`'s docs and the README.

use std::hint::black_box;
use std::time::Instant;

use shufflefs::coded::packet::{decode, encode, packet_len, xor_into};
use shufflefs::coded::{Scheme, Transmission, next_instance, plan, plan_by_size};
use shufflefs::plan::placement::RandomPlacement;

fn sample(s: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ s.wrapping_mul(2_654_435_761)) as u8)
        .collect()
}

fn main() {
    // `cargo bench` passes --bench; under `cargo test --all-targets` (a debug build), a smoke
    // run of 1 MB per row.
    let full = std::env::args().any(|a| a == "--bench");
    let volume: usize = std::env::var("SHUFFLEFS_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 256 } else { 1 })
        << 20;
    println!(
        "{:>10} {:>3} {:>14} {:>14} {:>14}",
        "sample", "k", "encode MB/s", "decode MB/s", "xor MB/s"
    );
    for len in [4 << 10, 100_000, 1 << 20] {
        for k in [1usize, 2, 4, 8] {
            let samples: Vec<Vec<u8>> = (0..k as u64).map(|s| sample(s, len)).collect();
            let tx = Transmission {
                parts: (0..k).map(|i| (i as u64, i)).collect(),
                group: (0..k).collect(),
            };
            let rounds = (volume / len).max(1);
            let mut read = |s: u64| Ok(samples[s as usize].clone());
            let t = Instant::now();
            let mut packet = Vec::new();
            for _ in 0..rounds {
                packet = black_box(encode(&tx, &mut read).expect("encode"));
            }
            let enc = (rounds * len) as f64 / t.elapsed().as_secs_f64() / 1e6;
            let mut cached = |s: u64| Some(samples[s as usize].clone());
            let t = Instant::now();
            for _ in 0..rounds {
                let got = decode(black_box(&packet), 0, &mut cached).expect("decode");
                assert_eq!(got[0].1.len(), len);
            }
            let dec = (rounds * len) as f64 / t.elapsed().as_secs_f64() / 1e6;
            let mut acc = samples[0].clone();
            let t = Instant::now();
            for _ in 0..rounds {
                xor_into(black_box(&mut acc), &samples[k - 1]);
            }
            let xor = (rounds * len) as f64 / t.elapsed().as_secs_f64() / 1e6;
            println!("{len:>10} {k:>3} {enc:>14.0} {dec:>14.0} {xor:>14.0}");
        }
    }
    padding_table();
}

/// A log-normal sample size of mean 100 KB and coefficient of variation `cv`, a pure
/// function of the sample id.
fn size(s: u64, cv: f64) -> u64 {
    let h = |k: u64| {
        let x = (s << 8 ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let z = (-2.0 * h(1).ln()).sqrt() * (std::f64::consts::TAU * h(2)).cos();
    let var = (1.0 + cv * cv).ln();
    (100_000.0 * (z * var.sqrt() - var / 2.0).exp()) as u64
}

fn padding_table() {
    println!();
    println!(
        "{:>3} {:>5} {:>14} {:>14} {:>9}",
        "n", "cv", "server bytes", "by size", "packets"
    );
    for n in [4usize, 8, 20] {
        let inst = next_instance(
            &mut RandomPlacement::new(20_000, n, 2.0 / n as f64, 1).expect("placement"),
        );
        let uncoded = plan(&inst, Scheme::Uncoded);
        let uber = plan(&inst, Scheme::Ubershuffle { nu: 2 });
        for cv in [0.0, 0.25, 0.5, 1.0, 2.0] {
            let bytes = |txs: &[Transmission]| -> u64 {
                txs.iter()
                    .map(|t| {
                        packet_len(
                            &t.parts
                                .iter()
                                .map(|&(s, _)| size(s, cv))
                                .collect::<Vec<_>>(),
                        )
                    })
                    .sum()
            };
            let sized = plan_by_size(&inst, Scheme::Ubershuffle { nu: 2 }, &|s| size(s, cv));
            println!(
                "{n:>3} {cv:>5.2} {:>14.3} {:>14.3} {:>9.3}",
                bytes(&uber) as f64 / bytes(&uncoded) as f64,
                bytes(&sized) as f64 / bytes(&uncoded) as f64,
                uber.len() as f64 / uncoded.len() as f64
            );
        }
    }
}
