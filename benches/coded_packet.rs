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
//! Last results (this VM, 2 cores shared with other builds, `cargo bench --bench
//! coded_packet`, 2026-11-23): encode 3.6 / 1.9 / 0.9 GB/s and decode 5.3 / 2.1 / 1.1 GB/s
//! for 100 KB samples and k = 2 / 4 / 8 parts; the XOR alone runs at 20-50 GB/s, so the cost
//! is the CRC-32C and the copy of each part, which grow with k. Every case is far above a
//! 1-10 Gbit/s link (125-1250 MB/s) except k = 8 with 1 MB samples against 10 Gbit/s.

use std::hint::black_box;
use std::time::Instant;

use shufflefs::coded::Transmission;
use shufflefs::coded::packet::{decode, encode, xor_into};

fn sample(s: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32 ^ s.wrapping_mul(2_654_435_761)) as u8)
        .collect()
}

fn main() {
    let volume: usize = std::env::var("SHUFFLEFS_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
        << 20;
    println!(
        "{:>10} {:>3} {:>14} {:>14} {:>14}",
        "sample", "k", "encode MB/s", "decode MB/s", "xor MB/s"
    );
    for len in [4 << 10, 100_000, 1 << 20] {
        for k in [1usize, 2, 4, 8] {
            let samples: Vec<Vec<u8>> = (0..k as u32).map(|s| sample(s, len)).collect();
            let tx = Transmission {
                parts: (0..k).map(|i| (i as u32, i)).collect(),
                group: (0..k).collect(),
            };
            let rounds = (volume / len).max(1);
            let mut read = |s: u32| Ok(samples[s as usize].clone());
            let t = Instant::now();
            let mut packet = Vec::new();
            for _ in 0..rounds {
                packet = black_box(encode(&tx, &mut read).expect("encode"));
            }
            let enc = (rounds * len) as f64 / t.elapsed().as_secs_f64() / 1e6;
            let mut cached = |s: u32| Some(samples[s as usize].clone());
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
}
