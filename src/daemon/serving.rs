//! The seam between the daemon and `node`: the one function that starts a rank's node,
//! puts the mount in front of it and runs its exchanges on the thread that owns MPI, until
//! the mount ends. Every call from `daemon` into `node` is here, so a change of the
//! exchange's entry points touches this file only.
//!
//! # Leaving
//! Ranks stop at different times (a trainer finishes early, one rank is unmounted). A
//! partial rank that stops first drains the exchange in flight (`mounted`), releases its
//! cache (so `shufflefs unmount` returns), then serves one more exchange without a sample
//! (`Partial::leave`): peers already in it, or about to start it, complete it and learn
//! that it left; their later exchanges leave it out and fetch its samples from the source.
//! The daemon then waits in MPI finalize for the others and exits 0 with them. A rank
//! whose FUSE session ended with an error leaves too (and exits 1 after): a peer that
//! leaves waits for every rank in that exchange, so skipping it would hang the whole job.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Receiver;

use crate::cache::SampleStore;
use crate::comm::Comm;
use crate::config::{MountConfig, ReadPath};
use crate::exchange::coded::CodedClient;
use crate::exchange::{
    EpochExchange, ExchangeConfig, ExchangeCtx, ExchangeError, Partial, Peers, Settled, arrivals,
};
use crate::fuse::read_path::Choice;
use crate::node::jobview::{self, Gatherer, Viewed};
use crate::node::requests::Requests;
use crate::node::status::ReadPathSnapshot;
use crate::node::{ExchangeCmd, Node, NodeConfig, serve};
use crate::plan::elastic::ElasticPlan;
use crate::plan::equal::EqualShares;
use crate::plan::{EpochShares, Plan, Step};
use crate::vfs::ShuffleFs;

use super::DaemonError;
use super::metrics_file::{self, MetricsFile};
use super::mounted::{Hooks, Mounted};
use super::startup::Prepared;
use super::startup::fit::Fit;

/// How this rank's exchanges run: partial-local over `comm` with these settings, or coded
/// from the server over `world`.
pub(crate) struct Exchanges {
    pub cfg: ExchangeConfig,
    pub peers: Peers,
    pub coded: Option<CodedClient>,
}

/// Runs one prepared rank: node, mount (`mount_everywhere`, the agreed last phase of
/// start-up), readiness (the ready file, `super::ready`, then `on_ready`), exchanges until
/// unmounted (the ready file goes with the mount), then the ordered teardown.
pub(crate) fn run_node(
    config: &MountConfig,
    prepared: Prepared,
    exchanges: Exchanges,
    (comm, mut world): (&mut dyn Comm, Option<&mut dyn Comm>),
    on_ready: &mut dyn FnMut(&str),
) -> Result<(), DaemonError> {
    let Prepared {
        store,
        plan,
        elastic,
        resumed,
        mountpoint,
        mount_dirs,
        fit,
    } = prepared;
    let rank = comm.rank();
    let leave_plan = plan.clone();
    let node_cfg = NodeConfig {
        exchange: exchanges.cfg,
        staging_threads: config.staging_threads,
        source: config.source.display().to_string(),
        mountpoint: mountpoint.display().to_string(),
        exchanges: true,
        hosts: comm.hosts().to_vec(),
    };
    let read_path = read_path(config, &store, (&resumed.current, fit.as_ref()), comm);
    let (node, queue) = Node::start(store.clone(), plan, rank, resumed, node_cfg);
    if let Some(fit) = fit.filter(|f| !f.fits()) {
        let _ = node.status.partial.set(fit.snapshot());
    }
    let fs = view(config, &node, (rank, read_path), elastic);
    let session = super::mount_everywhere(
        config,
        fs,
        (&mountpoint, mount_dirs),
        comm,
        world.as_deref_mut(),
    )
    .inspect_err(|_| node.coordinator.shutdown())?;
    let Some((session, made)) = session else {
        node.coordinator.shutdown();
        store.dir().unlock();
        return Ok(());
    };
    // Every rank mounted: the job view starts here on all of them (collective).
    let (mut view, _metrics) = observers(config, comm, &node);
    let mounted = Mounted::serve(session, &mountpoint, hooks(&node), made)?;
    let current = node.coordinator.current();
    // Every rank's mount answers: rank 0 says so in the ready file (removed as it stops).
    mounted.hold_ready(super::ready::agree(
        config,
        comm,
        &mountpoint,
        current.epoch,
    ));
    on_ready(&super::ready_line(
        config,
        comm,
        (&store, node.status.partial.get()),
        &current,
        world.is_some(),
    ));
    let abort = mounted.abort_flag();
    let (served, partial) = exchange_until_unmounted(
        (comm, world),
        exchanges,
        (&node, &queue),
        view.as_mut(),
        abort,
    );
    node.coordinator.shutdown();
    let stopped = with_view(comm, view.as_mut(), |comm| {
        stop_and_leave(comm, &node, mounted, served, partial, &leave_plan)
    });
    if let Some(view) = view {
        view.finish();
    }
    stopped
}

/// The job view (collective: every rank starts it once mounted) and the metrics file.
fn observers(
    config: &MountConfig,
    comm: &mut dyn Comm,
    node: &Node,
) -> (Option<Gatherer>, Option<MetricsFile>) {
    let status = node.status.clone();
    let observe = move || status.observe_exchanges();
    let view = jobview::start(comm, node.status.job().clone(), view_parts(node), observe);
    let metrics = (config.metrics_file.as_ref()).map(|template| {
        let path = metrics_file::path_for(template, comm.rank(), &jobview::hostname());
        MetricsFile::start(path, node.status.clone())
    });
    (view, metrics)
}

/// Serves exchanges until the mount goes: through the coded server (`world`) when there is
/// one, else the partial exchange among the ranks (whose last plan `stop_and_leave` needs).
fn exchange_until_unmounted(
    (comm, world): (&mut dyn Comm, Option<&mut dyn Comm>),
    exchanges: Exchanges,
    (node, queue): (&Node, &Receiver<ExchangeCmd>),
    view: Option<&mut Gatherer>,
    abort: &AtomicBool,
) -> (Result<(), ExchangeError>, Option<Recorded>) {
    if let (Some(world), Some(mut client)) = (world, exchanges.coded) {
        let served = with_view(world, view, |world| {
            serve(world, node, queue, &mut client, abort)
        });
        return (served, None);
    }
    let mut recorded = Recorded {
        partial: Partial {
            cfg: exchanges.cfg,
            peers: exchanges.peers,
        },
        last: None,
    };
    let served = with_view(comm, view, |comm| {
        serve(comm, node, queue, &mut recorded, abort)
    });
    (served, Some(recorded))
}

/// Runs `f` on `comm`, ticking the job view as it goes (see `node::jobview::Viewed`).
fn with_view<R>(
    comm: &mut dyn Comm,
    view: Option<&mut Gatherer>,
    f: impl FnOnce(&mut dyn Comm) -> R,
) -> R {
    match view {
        Some(view) => f(&mut Viewed { inner: comm, view }),
        None => f(comm),
    }
}

/// What the job view reads of this rank.
fn view_parts(node: &Node) -> jobview::Parts {
    jobview::Parts {
        store: node.store.clone(),
        epochs: node.coordinator.clone(),
        staging: node.staging.progress.clone(),
        exchange: node.tracker.clone(),
    }
}

/// The ordered teardown once the exchange loop returned, then (partial, several ranks, the
/// transport intact) the leaving exchange (see "Leaving").
fn stop_and_leave(
    comm: &mut dyn Comm,
    node: &Node,
    mounted: Mounted,
    served: Result<(), ExchangeError>,
    partial: Option<Recorded>,
    plan: &Plan,
) -> Result<(), DaemonError> {
    let transport_intact = served.is_ok();
    let stopped = match served {
        Ok(()) => mounted.stop(),
        Err(e) => {
            drop(mounted);
            Err(DaemonError::Abandoned(e))
        }
    };
    node.store.dir().unlock();
    match partial {
        // Also after a session that ended with an error (the kernel may abort the
        // connection as the mount goes): peers already leaving wait in that exchange for
        // every rank, however long, so a rank that skipped it would hang the job.
        Some(recorded) if transport_intact && comm.size() > 1 => {
            let last = (recorded.last).unwrap_or_else(|| node.coordinator.current().epoch);
            let rank = comm.rank();
            let root = node.store.dir().root();
            let current = Arc::new(crate::node::saved::own_shares_at(root, plan, rank, last));
            // The peers name what arrives into `last + 1` with this rank first (it sends
            // them their names, and hears its own: `exchange::arrivals`) — unless that is
            // the first exchange since start-up, whose step every rank took named from its
            // resume, with no round (this rank ran no exchange yet).
            let step = match recorded.last {
                Some(_) => {
                    let takes_part = |peer| recorded.partial.takes_part(peer, last + 1);
                    let never = AtomicBool::new(false);
                    arrivals::named(comm, plan, &current, &takes_part, &never)
                }
                None => plan.own_step(rank, &current),
            };
            leave(comm, recorded.partial, node, &step).and(stopped)
        }
        _ => stopped,
    }
}

/// What the mounted rank needs of `node` (see `Hooks`).
fn hooks(node: &Node) -> Hooks {
    let (queue_tx, tracker, coordinator) = (
        node.exchange_queue(),
        node.tracker.clone(),
        node.coordinator.clone(),
    );
    Hooks {
        stop: Box::new(move || {
            let _ = queue_tx.send(ExchangeCmd::Shutdown);
        }),
        progress: Box::new(move || {
            let reports = tracker.snapshot();
            let moved = |r: &crate::exchange::ExchangeReport| {
                r.bytes_sent + r.bytes_received + r.samples_sent + r.samples_received
            };
            reports.iter().map(moved).sum()
        }),
        invalidations: node.invalidations(),
        invalidated: Box::new(move |old| coordinator.invalidated(old)),
        give_up_waits: {
            let coordinator = node.coordinator.clone();
            Box::new(move || coordinator.give_up_waits())
        },
    }
}

/// Serves the exchange after the last one this rank ran, as a rank that left (see
/// "Leaving"); a transport that had to abandon transfers ends the job as in `serve`.
fn leave(
    comm: &mut dyn Comm,
    mut partial: Partial,
    node: &Node,
    step: &Step,
) -> Result<(), DaemonError> {
    let target = step.next.epoch;
    tracing::info!(
        target_epoch = target,
        "leaving: serving the peers' exchange into the next epoch without samples, then waiting for them"
    );
    match partial.leave(comm, &node.store, &node.tracker, step) {
        Ok(()) => Ok(()),
        Err(e) if e.is_abandoned() => Err(DaemonError::Abandoned(e)),
        Err(e) => {
            tracing::warn!("leaving: the exchange into epoch {target} ended with: {e}");
            Ok(())
        }
    }
}

/// The partial exchange, remembering the last exchange it ran: a rank that leaves serves
/// the one after it.
struct Recorded {
    partial: Partial,
    last: Option<u64>,
}

impl EpochExchange for Recorded {
    fn takes_part(&self, peer: u32, target: u64) -> bool {
        self.partial.takes_part(peer, target)
    }

    fn run(
        &mut self,
        comm: &mut dyn Comm,
        step: &Step,
        ctx: ExchangeCtx<'_>,
        settled: Settled<'_>,
    ) -> Result<(), ExchangeError> {
        self.last = Some(step.next.epoch);
        self.partial.run(comm, step, ctx, settled)
    }
}

/// The filesystem over `node` as `config` shows it: part size, the source's owners and
/// modes (each entry's own under `--allow-other`), and under `--equal-shares` the samples
/// left out (also shown in the status); with the read path it is mounted with (kept for
/// the status) and where its requests are counted.
fn view(
    config: &MountConfig,
    node: &Node,
    (rank, read_path): (u32, Choice),
    elastic: Option<ElasticPlan>,
) -> (ShuffleFs, ReadPath, Arc<Requests>) {
    let path = read_path.path;
    let _ = node.status.read_path.set(ReadPathSnapshot {
        path: path.name(),
        why: read_path.why,
    });
    let mut fs = ShuffleFs::of(node);
    if config.equal_shares {
        // A resized job's counts are replayed through its history (see `plan::equal`).
        let equal = Arc::new(match elastic {
            Some(elastic) => EqualShares::of_history(elastic, rank),
            None => EqualShares::new(node.coordinator.plan().clone(), rank),
        });
        let _ = node.status.equal_shares.set(equal.clone());
        fs = fs.with_equal_shares(equal);
    }
    let fs = fs
        .with_part_size(config.source_config.part_size())
        .with_access(
            crate::vfs::access::Access::of_source(&config.source)
                .per_entry(config.owners_per_entry()),
        );
    (fs, path, node.status.requests.clone())
}

/// The read path this rank mounts with (`fuse::read_path::choose` over its first share and
/// the machine), logged.
fn read_path(
    config: &MountConfig,
    store: &SampleStore,
    (current, fit): (&EpochShares, Option<&Fit>),
    comm: &dyn Comm,
) -> Choice {
    use crate::fuse::read_path::{Machine, Share, choose};
    let (rank, hosts) = (comm.rank(), comm.hosts());
    // The share's bytes as the cache-fit estimate counted them (sizes the index knows, else
    // rank 0's probe of the source, in the cache's blocks: what pages take too).
    let share = Share {
        samples: current.share(rank).len() as u64,
        bytes: fit.map(|f| f.share_bytes),
        file_per_sample: store.layout() == crate::cache::CacheLayout::Files
            && store.manifest().records().is_none(),
        partial: fit.is_some_and(|f| !f.fits()),
        allow_other: config.allow_other,
    };
    let here = hosts.get(rank as usize);
    let ranks_here = hosts.iter().filter(|&h| Some(h) == here).count().max(1);
    let machine = Machine {
        memory: crate::sys::memory::memory_limit(),
        ranks_here: u32::try_from(ranks_here).unwrap_or(u32::MAX),
    };
    let choice = choose(config.read_path, share, machine);
    tracing::info!(read_path = choice.path.name(), why = %choice.why, "read path chosen");
    choice
}
