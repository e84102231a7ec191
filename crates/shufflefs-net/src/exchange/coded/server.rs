//! The server rank (`shufflefs serve`): holds the dataset, computes each step's packets and
//! multicasts them, and answers requests for plain samples (protocol in the parent module).
//!
//! # Memory
//! The server reads samples from its source. The first samples it reads stay in memory
//! until `--memory` bytes are used; any sample past that is read from the source each time a
//! packet or a request needs it (streamed, never held). With the budget at least the
//! dataset's size, every sample is read from the source once for the whole run.
//!
//! # Sizes
//! Every step the server sends the compute ranks the sizes of the samples the step moves
//! (`sizes`), so all pair samples into packets alike. A size the manifest lacks (a scanned
//! source) is learned by reading the sample the first time a step needs it and kept (8 bytes
//! per sample); a sample past the memory budget is then read once more for its packet.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::sizes::{self, StepSizes};
use super::wire::Bundle;
use super::{BUNDLE, LAST, MORE, Request, Routes, STOP, TAG_SIZES, recv_requests, send_head};
use super::{routes, send_all, send_totals};
use crate::coded::packet;
use crate::coded::{Scheme, Transmission, next_placed_instance};
use crate::comm::{Comm, CommError};
use crate::dataset::{Dataset, Manifest};
use crate::plan::coded_keep::CodedPlacement;
use crate::plan::{CodedShares, Rank, SampleId};

/// A size not learned yet.
const UNKNOWN: u64 = u64::MAX;

/// The source behind the server, with the memory rule of the module docs.
pub struct ServerSamples {
    dataset: Arc<dyn Dataset>,
    manifest: Arc<Manifest>,
    held: Vec<Option<Arc<Vec<u8>>>>,
    /// Sizes learned by reading, [`UNKNOWN`] until then.
    sizes: Vec<u64>,
    budget: u64,
    used: u64,
    pub reads: u64,
}

impl ServerSamples {
    pub fn new(dataset: Arc<dyn Dataset>, manifest: Arc<Manifest>, budget: u64) -> ServerSamples {
        ServerSamples {
            dataset,
            held: vec![None; manifest.len() as usize],
            sizes: vec![UNKNOWN; manifest.len() as usize],
            manifest,
            budget,
            used: 0,
            reads: 0,
        }
    }

    /// Sample `id`'s bytes.
    pub fn get(&mut self, id: SampleId) -> std::io::Result<Arc<Vec<u8>>> {
        let slot = self
            .held
            .get_mut(id as usize)
            .ok_or_else(|| std::io::Error::other(format!("no sample {id}")))?;
        if let Some(b) = slot {
            return Ok(b.clone());
        }
        let mut bytes = Vec::new();
        self.dataset.copy_to(id, &mut bytes)?;
        self.reads += 1;
        let bytes = Arc::new(bytes);
        self.sizes[id as usize] = bytes.len() as u64;
        if self.used + bytes.len() as u64 <= self.budget {
            self.used += bytes.len() as u64;
            *slot = Some(bytes.clone());
        }
        Ok(bytes)
    }

    /// Sample `id`'s size: the manifest's, else learned by reading it (once for the run;
    /// a sample past the memory budget is read again for its packet). 0 if unreadable.
    pub(crate) fn size(&mut self, id: SampleId) -> u64 {
        if let Some(len) = self.manifest.size(id) {
            return len;
        }
        match self.sizes.get(id as usize) {
            Some(&len) if len != UNKNOWN => len,
            _ => self.get(id).map_or(0, |b| b.len() as u64),
        }
    }

    /// Bytes held in memory.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.used
    }
}

/// What the server needs to know of the run (compute rank 0 sends it at start-up).
#[derive(Clone, Debug)]
pub struct ServeSettings {
    pub shares: CodedShares,
    pub scheme: Scheme,
    /// The epoch the compute ranks start (or resume) at.
    pub epoch: u64,
}

/// What the server sent in one step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepStats {
    pub target_epoch: u64,
    pub packets: u64,
    pub packet_bytes: u64,
    /// What the uncoded scheme would have sent (one packet per missing sample).
    pub uncoded_bytes: u64,
    /// Samples sent plainly: cache fills and fallbacks.
    pub plain_samples: u64,
    pub fallback_samples: u64,
    /// Seconds spent building packets (reading samples and XOR).
    pub encode_seconds: f64,
}

/// The server's loop state.
pub struct Server {
    settings: ServeSettings,
    placement: CodedPlacement,
    routes: Routes,
    samples: ServerSamples,
    steps: Vec<StepStats>,
}

/// Why the server stopped serving.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// A compute rank left (the job is ending).
    RankLeft(Rank),
    /// The ranks asked for different epochs.
    Disagree(String),
}

impl Server {
    pub fn new(settings: ServeSettings, routes: Routes, samples: ServerSamples) -> Server {
        Server {
            placement: settings.shares.placement_at(settings.epoch),
            settings,
            routes,
            samples,
            steps: Vec::new(),
        }
    }

    /// What each step served so far sent, oldest first.
    pub fn steps(&self) -> &[StepStats] {
        &self.steps
    }

    /// Serves step after step until a compute rank leaves or the transport fails.
    pub fn serve(&mut self, world: &mut dyn Comm, abort: &AtomicBool) -> Result<Ended, CommError> {
        loop {
            let hellos = recv_requests(world, abort)?;
            let Some(target) = self.check(&hellos) else {
                return self.stop(world, &hellos, abort);
            };
            if let Some(ended) = self.step(world, &hellos, target, abort)? {
                return Ok(ended);
            }
        }
    }

    /// One step into `target` after its hellos (protocol steps 1-5 of the parent module);
    /// `Some` if the server must stop.
    fn step(
        &mut self,
        world: &mut dyn Comm,
        hellos: &[Request],
        target: u64,
        abort: &AtomicBool,
    ) -> Result<Option<Ended>, CommError> {
        let started = Instant::now();
        self.placement.advance_to(target - 1);
        let plain = self.answer(world, hellos, abort)?;
        let inst = next_placed_instance(&mut self.placement);
        let needed = sizes::needed(&inst);
        let lens = needed.iter().map(|&id| self.samples.size(id)).collect();
        let sizes = StepSizes::new(needed, lens);
        send_all(world, TAG_SIZES, &sizes.encode(), abort)?;
        let txs = sizes.plan(&inst, self.settings.scheme);
        let (packet_bytes, encode_seconds) = self.send_packets(world, &txs, &sizes, abort)?;
        let fallbacks = recv_requests(world, abort)?;
        if fallbacks.contains(&Request::Bye) {
            // Not part of the protocol: a rank leaves only between steps.
            return Ok(Some(Ended::Disagree(
                "a rank left in the middle of a step".into(),
            )));
        }
        let fell_back = self.answer(world, &fallbacks, abort)?;
        let uncoded_bytes = sizes.uncoded_bytes(&inst);
        send_totals(world, packet_bytes, uncoded_bytes, abort)?;
        self.steps.push(StepStats {
            target_epoch: target,
            packets: txs.len() as u64,
            packet_bytes,
            uncoded_bytes,
            plain_samples: plain + fell_back,
            fallback_samples: fell_back,
            encode_seconds,
        });
        tracing::info!(
            epoch = target,
            scheme = self.settings.scheme.name(),
            packets = txs.len(),
            packet_bytes,
            uncoded_bytes,
            ratio = packet_bytes as f64 / uncoded_bytes.max(1) as f64,
            cache_fill_samples = plain,
            fallback_samples = fell_back,
            source_reads = self.samples.reads,
            held_bytes = self.samples.held_bytes(),
            secs = started.elapsed().as_secs_f64(),
            "coded exchange served"
        );
        Ok(None)
    }

    /// Builds and delivers `txs`, burst by burst; returns their bytes and the seconds spent
    /// building them.
    fn send_packets(
        &mut self,
        world: &mut dyn Comm,
        txs: &[Transmission],
        sizes: &StepSizes,
        abort: &AtomicBool,
    ) -> Result<(u64, f64), CommError> {
        let (mut packet_bytes, mut encode_seconds) = (0u64, 0.0);
        for burst in self.routes.bursts(txs, |id| Some(sizes.len(id))) {
            let encoding = Instant::now();
            let packets: Vec<Vec<u8>> = txs[burst.packets.clone()]
                .iter()
                .map(|tx| {
                    let samples = &mut self.samples;
                    packet::encode(tx, &mut |s| samples.get(s).map(|b| b.to_vec()))
                        .unwrap_or_else(|e| {
                            tracing::warn!(error = %e, "cannot build a packet; its receivers will ask for their samples plainly");
                            Vec::new()
                        })
                })
                .collect();
            encode_seconds += encoding.elapsed().as_secs_f64();
            packet_bytes += packets.iter().map(|p| p.len() as u64).sum::<u64>();
            let msg = routes::pack(&packets);
            self.routes.deliver(world, burst.route, msg, abort)?;
        }
        Ok((packet_bytes, encode_seconds))
    }

    /// The common target epoch of the hellos, or `None` if the server must stop.
    fn check(&self, hellos: &[Request]) -> Option<u64> {
        let mut target = None;
        for h in hellos {
            match h {
                Request::Bye => return None,
                Request::Want { epoch, .. } => match target {
                    None => target = Some(*epoch),
                    Some(t) if t != *epoch => return None,
                    Some(_) => {}
                },
            }
        }
        target.filter(|&t| t >= 1 && t > self.placement.epoch())
    }

    fn stop(
        &mut self,
        world: &mut dyn Comm,
        hellos: &[Request],
        abort: &AtomicBool,
    ) -> Result<Ended, CommError> {
        let mut left = None;
        for (i, h) in hellos.iter().enumerate() {
            let rank = i as Rank + 1;
            match h {
                Request::Bye => left = left.or(Some(rank)),
                Request::Want { .. } => send_head(world, rank, STOP, Vec::new(), abort)?,
            }
        }
        Ok(match left {
            Some(r) => Ended::RankLeft(r),
            None => {
                let epochs: Vec<String> = hellos
                    .iter()
                    .map(|h| match h {
                        Request::Want { epoch, .. } => epoch.to_string(),
                        Request::Bye => "-".into(),
                    })
                    .collect();
                Ended::Disagree(format!(
                    "compute ranks asked for epochs {} (server at {})",
                    epochs.join(","),
                    self.placement.epoch()
                ))
            }
        })
    }

    /// Sends every rank the plain samples it asked for; returns how many.
    fn answer(
        &mut self,
        world: &mut dyn Comm,
        reqs: &[Request],
        abort: &AtomicBool,
    ) -> Result<u64, CommError> {
        let mut sent = 0u64;
        for (i, r) in reqs.iter().enumerate() {
            let rank = i as Rank + 1;
            let ids: &[SampleId] = match r {
                Request::Want { ids, .. } => ids,
                Request::Bye => &[],
            };
            let mut bundle = Bundle::default();
            for &id in ids {
                let got = self.samples.get(id);
                bundle.push(
                    id,
                    got.as_deref().map(|b| b.as_slice()).map_err(|e| {
                        tracing::warn!(sample = id, error = %e, "cannot read a sample asked for");
                        std::io::Error::other(e.to_string())
                    }),
                );
                sent += 1;
                if bundle.0.len() >= BUNDLE {
                    send_head(world, rank, MORE, std::mem::take(&mut bundle.0), abort)?;
                }
            }
            send_head(world, rank, LAST, bundle.0, abort)?;
        }
        Ok(sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::SyntheticSource;

    #[test]
    fn samples_stay_in_memory_until_the_budget_is_used() {
        let names = (0..4).map(|i| (format!("{i}").into_bytes(), 100)).collect();
        let manifest = Arc::new(Manifest::from_parts(vec![(b"c".to_vec(), names)]).unwrap());
        let source = Arc::new(SyntheticSource {
            manifest: manifest.clone(),
        });
        let mut s = ServerSamples::new(source, manifest, 250);
        for round in 1..=3 {
            for id in 0..4 {
                let b = s.get(id).unwrap();
                assert_eq!(b.len(), 100);
                assert_eq!(b[7], crate::dataset::synthetic_byte(id, 7));
            }
            // Samples 0 and 1 were read once and kept; 2 and 3 are read every time.
            assert_eq!(s.reads, 2 + 2 * round);
        }
        assert_eq!(s.held_bytes(), 200);
        assert!(s.get(9).is_err(), "no such sample");
    }
}
