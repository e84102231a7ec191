//! A compute rank's side of the coded exchange (protocol in the parent module).

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use super::liveness::{ServerId, WATCH_EVERY};
use super::side::SideInfo;
use super::sizes::{self, StepSizes};
use super::{CodedReport, LAST, MORE, Request, Routes, STOP, comm_err, recv_piece, send_request};
use super::{TAG_SIZES, recv_exact, recv_totals, routes, wire};
use crate::cache::SampleStore;
use crate::coded::packet::{self, DecodeError};
use crate::coded::{Instance, Node, Scheme, Transmission, next_placed_instance};
use crate::comm::Comm;
use crate::exchange::{
    EpochExchange, ExchangeCtx, ExchangeError, ExchangeState, ExchangeTracker, Settled,
};
use crate::plan::coded_keep::CodedPlacement;
use crate::plan::{Plan, Rank, SampleId, Step};

/// One compute rank's coded exchanges, epoch after epoch.
pub struct CodedClient {
    node: Node,
    scheme: Scheme,
    /// Every rank's cache at the epoch before the next exchange.
    placement: CodedPlacement,
    routes: Routes,
    /// Why the coded exchange ended for good (the server stopped it), if it did.
    stopped: Option<String>,
}

impl CodedClient {
    /// Compute rank `rank` of a coded `plan`, whose next exchange leaves `epoch`.
    pub fn new(plan: &Plan, rank: Rank, scheme: Scheme, routes: Routes, epoch: u64) -> Self {
        let shares = plan
            .coded_shares()
            .expect("a coded client needs the coded plan");
        CodedClient {
            node: rank as Node,
            scheme,
            placement: shares.placement_at(epoch),
            routes,
            stopped: None,
        }
    }

    /// This rank's part of the exchange into `step.next.epoch`; must be called by every
    /// compute rank for the same step while the server serves it, on the thread that owns
    /// `world`. Calls `settled` once, when this rank holds what the exchange brings or it
    /// failed.
    pub fn run(
        &mut self,
        world: &mut dyn Comm,
        store: &SampleStore,
        step: &Step,
        tracker: &ExchangeTracker,
        abort: &AtomicBool,
        settled: &mut dyn FnMut(Result<(), &ExchangeError>),
    ) -> Result<(), ExchangeError> {
        let target = step.next.epoch;
        let started = Instant::now();
        tracker.update(target, |r| r.state = ExchangeState::Running);
        let result = self.exchange(world, store, target, tracker, abort);
        let seconds = started.elapsed().as_secs_f64();
        tracker.update(target, |r| {
            r.state = match result {
                Ok(()) => ExchangeState::Done,
                Err(_) => ExchangeState::Failed,
            };
            r.error = result.as_ref().err().map(ToString::to_string);
            r.settled_seconds = seconds;
            r.seconds = seconds;
        });
        settled(result.as_ref().map(|_| ()));
        result
    }

    fn exchange(
        &mut self,
        world: &mut dyn Comm,
        store: &SampleStore,
        target: u64,
        tracker: &ExchangeTracker,
        abort: &AtomicBool,
    ) -> Result<(), ExchangeError> {
        self.may_start(target, abort)?;
        // Not the daemon's abort flag (module docs, "Giving up"): only a dead server.
        let give_up = AtomicBool::new(false);
        let server = self.routes.server().filter(|s| s.visible()).cloned();
        std::thread::scope(|scope| {
            let (done, watching) = mpsc::channel::<()>();
            if let Some(server) = &server {
                let give_up = &give_up;
                let watch = move || watch_server(server, target, &watching, give_up);
                let spawned = std::thread::Builder::new()
                    .name("coded-watch".into())
                    .spawn_scoped(scope, watch);
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot watch the coded-shuffle server's process");
                }
            }
            let result = self.steps(world, store, target, tracker, &give_up);
            drop(done);
            result
        })
    }

    /// The steps of one exchange (protocol in the parent module).
    fn steps(
        &mut self,
        world: &mut dyn Comm,
        store: &SampleStore,
        target: u64,
        tracker: &ExchangeTracker,
        abort: &AtomicBool,
    ) -> Result<(), ExchangeError> {
        self.placement.advance_to(target - 1);
        let me = self.node;
        let mut report = CodedReport {
            scheme: self.scheme.name(),
            multicast: self.routes.multicast().name(),
            ..CodedReport::default()
        };
        self.fill_cache(world, store, target, abort, &mut report)?;

        let cache: BTreeSet<SampleId> = self.placement.caches()[me].clone();
        let view: BTreeSet<SampleId> = self.placement.shares(target - 1).remove(me);
        let inst: Instance = next_placed_instance(&mut self.placement);
        let sizes = recv_sizes(world, &inst, abort).map_err(|e| comm_err(target, e))?;
        let txs = sizes.plan(&inst, self.scheme);
        let next_cache = &self.placement.caches()[me];
        let mut side = SideInfo::new(me, &txs, &cache, &view, next_cache);
        report.packets_planned = txs.len() as u64;
        // What this rank lacks of its next share: the samples (and their bytes, as the
        // server read them) that packets or the fallback must bring.
        let (missing, missing_bytes) = inst
            .missing(me)
            .fold((0u64, 0u64), |(n, b), id| (n + 1, b + sizes.len(id)));
        tracker.update(target, |r| {
            r.samples_to_receive = missing;
            r.bytes_to_receive = missing_bytes;
            r.coded = Some(report.clone());
        });
        let failed = self.receive_packets(
            world,
            store,
            (target, &sizes, &txs),
            &mut side,
            abort,
            &mut report,
        )?;
        tracker.update(target, |r| {
            r.bytes_received = report.share_bytes_received;
            r.coded = Some(report.clone());
        });

        self.fallback(world, store, target, failed, abort, &mut report)?;
        (report.server_packet_bytes, report.uncoded_packet_bytes) =
            recv_totals(world, abort).map_err(|e| comm_err(target, e))?;
        let received = report.samples_decoded + report.fallback_samples;
        // What the total (`bytes_to_receive`) counts; the wire bytes are in `report`.
        let bytes = report.share_bytes_received;
        tracker.update(target, |r| {
            r.samples_received = received;
            r.bytes_received = bytes;
            r.bytes_across_hosts = bytes;
            r.coded = Some(report);
        });
        if let Err(e) = store.sync() {
            return Err(ExchangeError::Sync(e));
        }
        Ok(())
    }

    /// Why the exchange into `target` must not start, if it must not.
    fn may_start(&self, target: u64, abort: &AtomicBool) -> Result<(), ExchangeError> {
        if let Some(why) = &self.stopped {
            return Err(ExchangeError::Local(why.clone()));
        }
        // The daemon is going away: start nothing (its goodbye follows, so the server stops
        // waiting for this rank). An exchange already under way is not given up: once every
        // rank said hello it ends in bounded time (each step is collective over ranks that
        // are all in it, and a rank that dies makes the launcher end the job), while giving
        // up would leave MPI transfers in flight and cost the whole job (see `comm`).
        if abort.load(Ordering::Relaxed) {
            return Err(ExchangeError::Local(
                "the daemon is shutting down; the exchange did not start".into(),
            ));
        }
        if self.placement.epoch() > target - 1 {
            return Err(ExchangeError::Local(format!(
                "coded exchange into epoch {target} asked after epoch {} was planned",
                self.placement.epoch()
            )));
        }
        Ok(())
    }

    /// The first step: the cache becomes C^t (the view's share is part of it); what it
    /// lacks comes plain from the server.
    fn fill_cache(
        &mut self,
        world: &mut dyn Comm,
        store: &SampleStore,
        target: u64,
        abort: &AtomicBool,
        report: &mut CodedReport,
    ) -> Result<(), ExchangeError> {
        let (me, from) = (self.node, target - 1);
        // The cache holds C^t from here on (the view's share is part of it), plus whatever of
        // the next share an interrupted attempt (before a crash) already brought.
        let cache: BTreeSet<SampleId> = self.placement.caches()[me].clone();
        // What arrives: the next share, or the kept part of it (`plan::coded_keep`: a
        // sample of the next share not kept must not take the room of one that is).
        let kept = self.placement.next_kept(me);
        if let (Some(kept), Some(gate)) = (&kept, store.partial()) {
            // The gate's kept set at `target`, so its publication need not step for it.
            gate.prepare(target, kept.iter().copied().collect());
        }
        let next = kept.unwrap_or_else(|| self.placement.shares(target).remove(me));
        drop_outside(store, &cache, &next);
        let share: BTreeSet<SampleId> = self.placement.shares(from).remove(me);
        let lacking: Vec<SampleId> = cache
            .difference(&share)
            .copied()
            .filter(|&id| !store.contains(id))
            .collect();
        let req = Request::Want {
            epoch: target,
            ids: lacking,
        };
        send_request(world, &req, abort).map_err(|e| comm_err(target, e))?;
        let (n, bytes, _) = self.receive_plain(world, store, target, abort)?;
        report.cache_fill_samples = n;
        report.plain_bytes_received += bytes;
        Ok(())
    }

    /// The coded packets of `txs` that reach this rank, burst by burst, dropping side
    /// information once no later packet needs it (`side`); returns the samples whose packet
    /// could not be decoded.
    fn receive_packets(
        &mut self,
        world: &mut dyn Comm,
        store: &SampleStore,
        (target, sizes, txs): (u64, &StepSizes, &[Transmission]),
        side: &mut SideInfo,
        abort: &AtomicBool,
        report: &mut CodedReport,
    ) -> Result<Vec<SampleId>, ExchangeError> {
        let me = self.node;
        let mut failed: Vec<SampleId> = Vec::new();
        drop_side(store, side.done_before(0));
        for burst in self.routes.bursts(txs, |id| Some(sizes.len(id))) {
            if self.routes.reaches(burst.route, me) {
                let msg = (self.routes)
                    .deliver(world, burst.route, Vec::new(), abort)
                    .map_err(|e| comm_err(target, e))?;
                let txs = &txs[burst.packets.clone()];
                let packets = routes::unpack(&msg, txs.len());
                for (i, tx) in txs.iter().enumerate() {
                    let packet = packets.as_ref().map_or(&[][..], |p| p[i]);
                    take_packet(store, me, tx, packet, report, &mut failed);
                }
            }
            drop_side(store, side.done_before(burst.packets.end));
        }
        Ok(failed)
    }

    /// The last step: what no packet brought (`failed`) comes plain from the server.
    fn fallback(
        &mut self,
        world: &mut dyn Comm,
        store: &SampleStore,
        target: u64,
        failed: Vec<SampleId>,
        abort: &AtomicBool,
        report: &mut CodedReport,
    ) -> Result<(), ExchangeError> {
        let asked = failed.len() as u64;
        let req = Request::Want {
            epoch: target,
            ids: failed,
        };
        send_request(world, &req, abort).map_err(|e| comm_err(target, e))?;
        let (n, bytes, stored) = self.receive_plain(world, store, target, abort)?;
        if n < asked {
            tracing::warn!(
                asked,
                got = n,
                "the server could not send every sample asked for; the rest come from the source"
            );
        }
        report.fallback_samples = n;
        report.plain_bytes_received += bytes;
        report.share_bytes_received += stored;
        Ok(())
    }

    /// Receives the server's plain samples until its last piece; returns how many were
    /// stored, the bytes received (framing included) and the stored samples' bytes. A stop
    /// ends the coded exchange for good.
    fn receive_plain(
        &mut self,
        world: &mut dyn Comm,
        store: &SampleStore,
        target: u64,
        abort: &AtomicBool,
    ) -> Result<(u64, u64, u64), ExchangeError> {
        let (mut n, mut bytes, mut stored) = (0u64, 0u64, 0u64);
        loop {
            let (more, bundle) = recv_piece(world, abort).map_err(|e| comm_err(target, e))?;
            if more == STOP {
                let why = "the coded-shuffle server stopped serving (a compute rank left or the ranks disagree on the epoch); what the exchange lacks comes from the source".to_string();
                self.stopped = Some(why.clone());
                return Err(ExchangeError::Local(why));
            }
            bytes += bundle.len() as u64;
            let entries = wire::unbundle(&bundle)
                .map_err(|e| ExchangeError::Local(format!("plain samples from the server: {e}")))?;
            for p in entries {
                let Some(b) = p.bytes else { continue };
                match store_bytes(store, p.id, b, p.crc) {
                    Ok(()) => {
                        n += 1;
                        stored += b.len() as u64;
                    }
                    Err(e) => {
                        tracing::warn!(sample = p.id, error = %e, "cannot store a sample from the server")
                    }
                }
            }
            if more != MORE {
                debug_assert_eq!(more, LAST);
                return Ok((n, bytes, stored));
            }
        }
    }

    /// Tells the server this rank is leaving (unless the coded exchange already ended).
    /// The server waits for every rank's next hello between steps, so this small send always
    /// finds its receive; it ignores the daemon's abort flag, which a shutdown may have set.
    pub fn goodbye(&mut self, world: &mut dyn Comm) {
        if self.stopped.is_some() {
            return;
        }
        if self.routes.server().is_some_and(ServerId::gone) {
            tracing::warn!("the coded-shuffle server (world rank 0) is gone; no goodbye to send");
            return;
        }
        self.stopped = Some("this rank is leaving".into());
        if let Err(e) = send_request(world, &Request::Bye, &AtomicBool::new(false)) {
            tracing::warn!(error = %e, "could not tell the coded-shuffle server this rank leaves");
        }
    }
}

/// The coded exchange behind the node's seam, over the world communicator (server
/// included).
impl EpochExchange for CodedClient {
    fn run(
        &mut self,
        world: &mut dyn Comm,
        step: &Step,
        ctx: ExchangeCtx<'_>,
        settled: Settled<'_>,
    ) -> Result<(), ExchangeError> {
        CodedClient::run(
            self,
            world,
            ctx.store,
            step,
            ctx.tracker,
            ctx.abort,
            settled,
        )
    }

    /// Keeps them: the client keeps the cache at exactly `C^t` itself, which retains some
    /// of the samples that left the share.
    fn evict(&mut self, _: &SampleStore, _: Vec<SampleId>) {}

    /// Says goodbye to the server.
    fn finish(&mut self, world: &mut dyn Comm) {
        self.goodbye(world);
    }
}

/// Until `done` closes: once `server`'s process is gone, says so and sets `give_up`, which
/// the transfers in flight watch (they are abandoned and the daemon ends, see `liveness`).
fn watch_server(server: &ServerId, target: u64, done: &mpsc::Receiver<()>, give_up: &AtomicBool) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(WATCH_EVERY) {
        if server.gone() {
            tracing::error!(
                server_pid = server.pid,
                target_epoch = target,
                "the coded-shuffle server (world rank 0) is gone in the middle of the exchange into epoch {target}: giving the exchange up; this rank unmounts and exits, and the same job started again resumes where it stopped"
            );
            give_up.store(true, Ordering::Relaxed);
            return;
        }
    }
}

/// Protocol step 2: the sizes of `inst`'s missing samples, as the server sent them.
fn recv_sizes(
    world: &mut dyn Comm,
    inst: &Instance,
    abort: &AtomicBool,
) -> Result<StepSizes, crate::comm::CommError> {
    let ids = sizes::needed(inst);
    let bytes = recv_exact(world, TAG_SIZES, ids.len() * 8, abort)?;
    Ok(StepSizes::decode(ids, &bytes).expect("a receive of exactly one u64 per sample"))
}

/// Takes one packet this rank received: decodes its part for `me` (if any) from the cache,
/// stores it once its CRC passed, or notes the sample in `failed` for a plain re-request.
fn take_packet(
    store: &SampleStore,
    me: Node,
    tx: &Transmission,
    packet: &[u8],
    report: &mut CodedReport,
    failed: &mut Vec<SampleId>,
) {
    report.packets_received += 1;
    report.packet_bytes_received += packet.len() as u64;
    let Some(&(want, _)) = tx.parts.iter().find(|&&(_, r)| r == me) else {
        return; // in the group, nothing to decode
    };
    let mut cached = |s: SampleId| store.contains(s).then(|| store.read(s).ok()).flatten();
    let decoding = Instant::now();
    let decoded = packet::decode(packet, me, &mut cached);
    report.decode_seconds += decoding.elapsed().as_secs_f64();
    match decoded {
        Ok(samples) if samples.iter().any(|(s, _)| *s == want) => {
            for (s, bytes) in samples {
                let len = bytes.len() as u64;
                match store_bytes(store, s, &bytes, crc32c::crc32c(&bytes)) {
                    Ok(()) => {
                        report.samples_decoded += 1;
                        report.share_bytes_received += len;
                    }
                    // The partial cache has no room for it: asking the server again would
                    // only be refused again (a reader gets it from the source).
                    Err(e) if crate::cache::admission::is_not_kept(&e) => {
                        tracing::warn!(sample = s, error = %e, "a decoded sample found no room in the partial cache; it is read from the source");
                    }
                    Err(e) => {
                        tracing::warn!(sample = s, error = %e, "cannot store a decoded sample; asking the server for it");
                        failed.push(s);
                    }
                }
            }
        }
        Ok(_) => {
            report.decode_failures += 1;
            failed.push(want);
        }
        Err(e) => {
            if let DecodeError::Stale { sample, .. } = e {
                // Our copy differs from the server's: it must not serve reads either (a
                // reader of it gets it from the source).
                let _ = store.remove(sample);
            }
            tracing::debug!(sample = want, error = %e, "cannot decode a packet; asking the server for the plain sample");
            report.decode_failures += 1;
            failed.push(want);
        }
    }
}

/// Writes `bytes` as sample `id`, checked against `crc` and the sample's known size. A
/// partial cache (`plan::coded_keep`) takes it only within its size: never into a full disk.
fn store_bytes(store: &SampleStore, id: SampleId, bytes: &[u8], crc: u32) -> std::io::Result<()> {
    if store.contains(id) {
        return Ok(());
    }
    let _room = store.room_for_received(id, bytes.len() as u64)?;
    store
        .insert_with(id, |out: &mut dyn Write| {
            out.write_all(bytes)?;
            Ok(Some(crc))
        })
        .map(|_| ())
}

/// Drops side information no packet of the step needs any more (see `side`).
fn drop_side(store: &SampleStore, ids: Vec<SampleId>) {
    for id in ids.into_iter().filter(|&id| store.contains(id)) {
        if let Err(e) = store.remove(id) {
            tracing::debug!(sample = id, error = %e, "cannot drop used side information");
        }
    }
}

/// Drops every cached sample outside `cache` and `next`.
fn drop_outside(store: &SampleStore, cache: &BTreeSet<SampleId>, next: &BTreeSet<SampleId>) {
    let keep = |id: &SampleId| cache.contains(id) || next.contains(id);
    for id in store.held().into_iter().filter(|id| !keep(id)) {
        if let Err(e) = store.remove(id) {
            tracing::warn!(sample = id, error = %e, "could not drop a sample that left the cache");
        }
    }
}
