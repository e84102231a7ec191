//! The server rank's side of a coded job's start-up (phases 1-4 of the parent module), then
//! its serving loop (`exchange::coded::server`) until the compute ranks leave.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::{CodedError, Layout, Offer, Role, SERVER_COLOR, comm, communicators, roles};
use crate::coded::groups::Communicators;
use crate::comm::Comm;
use crate::config::ServeConfig;
use crate::dataset::Manifest;
use crate::exchange::coded::routes::Multicast;
use crate::exchange::coded::server::Ended;
use crate::exchange::coded::{Routes, ServeSettings, Server, ServerId, ServerSamples};
use crate::plan::CodedShares;

/// The server's whole life: phases 1-4, then serving until the compute ranks leave.
pub(crate) fn serve(args: &ServeConfig, world: &mut dyn Comm) -> Result<(), CodedError> {
    // A signal (a scheduler ending the job) does not kill the server mid-collective: it
    // serves on until the compute ranks, which unmount on the same signal, leave.
    crate::daemon::mounted::listen_for_stop().map_err(|e| CodedError::Signals(Box::new(e)))?;
    match roles(world, &Role::server())? {
        Layout::Coded => {}
        Layout::Plain => unreachable!("a server makes the layout coded or refused"),
    }
    drop(
        world
            .split(SERVER_COLOR)
            .map_err(comm("splitting the compute ranks off the server"))?,
    );
    let msg = world
        .broadcast(1, Vec::new())
        .map_err(comm("receiving the settings from compute rank 0"))?;
    let (offer, manifest_bytes) = read_offer(&msg)?;
    let checked = check(args, &offer, manifest_bytes, world.size() - 1);
    let verdict = match &checked {
        Ok(_) => super::consent(&ServerId::mine()),
        Err(why) => why.as_bytes().to_vec(),
    };
    world
        .all_gather(&verdict)
        .map_err(comm("answering the compute ranks"))?;
    let (settings, manifest, comms, multicast) = checked.map_err(CodedError::Refused)?;
    let routes = Routes::create(world, None, comms, multicast)
        .map_err(comm("creating the multicast communicators"))?;
    let mounts = world
        .all_gather(&[])
        .map_err(comm("hearing whether the compute ranks mounted"))?;
    if mounts.iter().skip(1).all(|m| m == super::STOPPED) {
        tracing::info!("the compute ranks were told to stop before mounting; nothing to serve");
        return Ok(());
    }
    if mounts.iter().skip(1).any(|m| !m.is_empty()) {
        return Err(CodedError::Refused(
            "the compute ranks did not all mount (they say why); nothing to serve".into(),
        ));
    }
    tracing::info!(
        ranks = offer.ranks,
        samples = offer.samples,
        alpha = offer.alpha,
        scheme = settings.scheme.name(),
        epoch = offer.epoch,
        kept_slots = offer.slots,
        memory = args.memory,
        "serving the coded shuffle"
    );
    serve_until_left(args, world, settings, manifest, routes)
}

/// Compute rank 0's phase-3 message: its offer and the manifest, or why the compute ranks
/// did not start.
fn read_offer(msg: &[u8]) -> Result<(Offer, &[u8]), CodedError> {
    let refused = CodedError::Refused;
    match msg.split_first() {
        Some((0, rest)) if rest.len() >= 8 => {
            let len = u64::from_le_bytes(rest[..8].try_into().expect("8")) as usize;
            let json = rest
                .get(8..8 + len)
                .ok_or_else(|| refused("compute rank 0 sent cut settings".into()))?;
            let offer: Offer = serde_json::from_slice(json)
                .map_err(|e| refused(format!("compute rank 0 sent unreadable settings: {e}")))?;
            Ok((offer, &rest[8 + len..]))
        }
        Some((1, why)) => Err(refused(format!(
            "the compute ranks did not start, so there is nothing to serve: {}",
            String::from_utf8_lossy(why)
        ))),
        _ => Err(refused("compute rank 0 sent malformed settings".into())),
    }
}

/// The serving loop, until a compute rank leaves (the normal end) or the ranks disagree.
fn serve_until_left(
    args: &ServeConfig,
    world: &mut dyn Comm,
    settings: ServeSettings,
    manifest: Manifest,
    routes: Routes,
) -> Result<(), CodedError> {
    let manifest = Arc::new(manifest);
    let dataset = args.format.open(&args.source, manifest.clone());
    let samples = ServerSamples::new(dataset, manifest, args.memory);
    tracing::info!(
        communicators = routes.created(),
        multicast = routes.multicast().name(),
        exact_upto = routes.communicators().exact_upto(),
        "multicast communicators created"
    );
    let mut server = Server::new(settings, routes, samples);
    match server.serve(world, &AtomicBool::new(false)) {
        Ok(Ended::RankLeft(r)) => {
            tracing::info!(world_rank = r, "a compute rank left; the server stops");
            Ok(())
        }
        Ok(Ended::Disagree(why)) => Err(CodedError::Refused(format!("stopped serving: {why}"))),
        Err(e) => Err(comm("talking to the compute ranks")(e)),
    }
}

/// The server's checks of an offer against its own options and source. A refusal is a
/// message: the compute ranks get it in the server's answer.
fn check(
    args: &ServeConfig,
    offer: &Offer,
    manifest_bytes: &[u8],
    ranks: u32,
) -> Result<(ServeSettings, Manifest, Communicators, Multicast), String> {
    if offer.ranks != ranks {
        return Err(format!(
            "compute rank 0 plans for {} ranks, the job has {ranks}",
            offer.ranks
        ));
    }
    if let Some(seed) = args.seed.filter(|&s| s != offer.seed) {
        return Err(format!(
            "the server was started with --seed {seed}, the compute ranks use {}; give both the same --seed, or none to the server",
            offer.seed
        ));
    }
    let format = format!("{:?}", args.format).to_lowercase();
    if format != offer.format {
        return Err(format!(
            "the server reads --format {format}, the compute ranks {}",
            offer.format
        ));
    }
    if crate::dataset::manifest::fingerprint_of(manifest_bytes) != offer.manifest_fingerprint {
        return Err("the manifest from compute rank 0 arrived damaged".into());
    }
    let manifest = Manifest::decode(manifest_bytes)
        .map_err(|e| format!("the manifest from compute rank 0 is unreadable: {e}"))?;
    args.format
        .check_source(&args.source)
        .map_err(|e| format!("--source {}: {e}", args.source.display()))?;
    let shares = CodedShares::new(offer.samples, offer.ranks, offer.alpha, offer.seed)
        .map_err(|e| e.to_string())?
        .with_slots(offer.slots);
    let scheme = offer.scheme()?;
    let comms = communicators(offer.ranks, offer.communicators, offer.alpha)?;
    let multicast = offer.multicast()?;
    // A few samples read as a check that the server's source is the compute ranks' dataset.
    let n = manifest.len();
    let dataset = args.format.open(
        &args.source,
        Arc::new(Manifest::decode(manifest_bytes).expect("decoded above")),
    );
    for id in [0, n / 2, n.saturating_sub(1)]
        .into_iter()
        .filter(|&i| i < n)
    {
        let mut bytes = Vec::new();
        let got = dataset.copy_to(id, &mut bytes).map_err(|e| {
            format!(
                "the server's --source {} does not hold the compute ranks' dataset: {}: {e}",
                args.source.display(),
                dataset.describe(id)
            )
        })?;
        if let Some(want) = manifest.size(id).filter(|&w| w != got.len) {
            return Err(format!(
                "the server's --source {} does not hold the compute ranks' dataset: {} is {} bytes, {want} in their index",
                args.source.display(),
                dataset.describe(id),
                got.len
            ));
        }
    }
    let settings = ServeSettings {
        shares,
        scheme,
        epoch: offer.epoch,
    };
    Ok((settings, manifest, comms, multicast))
}
