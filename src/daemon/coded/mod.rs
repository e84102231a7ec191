//! Start-up of a coded job: one MPI job, MPMD, the server first:
//!
//! ```text
//! mpirun -np 1 shufflefs serve --source SRC : -np M shufflefs mount --exchange coded ...
//! ```
//!
//! World rank 0 serves; world ranks `1..=M` are the compute ranks, which split off their own
//! communicator so that everything that exists without a server (settings agreement,
//! manifest, resume, mount, views, status) runs unchanged on it, rank = compute rank. The
//! world communicator is kept for the exchange with the server.
//!
//! Phases on the world communicator, each a collective every rank reaches whatever happened
//! before it, so a failure anywhere stops every rank with a message and no rank waits forever:
//! 1. *Roles* (every `mount` under MPI takes part, coded or not): each rank says whether it
//!    serves or mounts, with which `--exchange`, and its version; every rank judges the same
//!    list ([`verdict`]): a server must be world rank 0 and alone, have compute ranks, and
//!    every compute rank must mount with `--exchange coded`; `--exchange coded` needs a server.
//! 2. *Split*: the compute ranks' communicator.
//! 3. *Settings* (after the compute ranks' own start-up): compute rank 0 broadcasts the run's
//!    settings and manifest, or why the compute ranks did not start. The server checks them
//!    against its own options and source and answers in an all-gather; a refusal stops the
//!    compute ranks before they mount, a consent names the server's process (pid, start
//!    time, pid namespace) for the compute ranks on its host to watch
//!    (`exchange::coded::liveness`). On consent every rank creates the multicast
//!    communicators (`--multicast broadcast`; a ring needs none), one collective split each.
//! 4. *Mounted*: the compute ranks tell the server whether they all mounted (if not, they
//!    unmounted again and the server exits too).

use serde::{Deserialize, Serialize};

use crate::coded::Scheme;
use crate::coded::groups::Communicators;
use crate::comm::{Comm, CommError};
use crate::config::{ExchangeMode, MountConfig};
use crate::exchange::coded::routes::Multicast;
use crate::exchange::coded::{Routes, ServerId};
use crate::plan::{CodedShares, Plan};

mod mode;
mod server;

pub(crate) use mode::{check_mode, record_mode};
pub(crate) use server::serve;

/// Why a coded job's start-up or its server stopped. What the ranks decided (a verdict every
/// rank reached alike, a refusal one rank sent the others over MPI) is a message, and stays
/// text; a collective that failed keeps its cause.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CodedError {
    /// A collective of the start-up or the serving loop failed (`doing`: which one).
    #[error("{doing}: {source}")]
    Comm {
        doing: &'static str,
        #[source]
        source: CommError,
    },
    /// The job's layout, its settings or its server refused (the message says why, the same
    /// on every rank or as the refusing rank sent it).
    #[error("{0}")]
    Refused(String),
    /// The server could not listen for stop signals.
    #[error(transparent)]
    Signals(Box<crate::daemon::DaemonError>),
}

/// A failed collective while `doing` something.
fn comm(doing: &'static str) -> impl FnOnce(CommError) -> CodedError {
    move |source| CodedError::Comm { doing, source }
}

/// Split colors of phase 2.
const SERVER_COLOR: u32 = 0;
pub(crate) const COMPUTE_COLOR: u32 = 1;

/// What phase 1 decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// No server: today's job, every rank a compute rank on the world communicator.
    Plain,
    /// A server at world rank 0 and coded compute ranks after it.
    Coded,
}

/// What each rank says of itself in phase 1.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Role {
    pub serve: bool,
    pub coded: bool,
    pub version: String,
    /// The coded protocol it speaks ([`CODED_PROTOCOL`]); absent (0) from a build before
    /// the numbers, whose server would ignore the kept sets' slots of the offer silently.
    #[serde(default)]
    pub protocol: u32,
}

/// The coded exchange's protocol between `serve` and the compute ranks: 2 since the offer
/// carries the kept sets' slots, which an older server would ignore and then
/// code over whole caches no rank holds. Builds of one version number can differ in it (a
/// development build), so phase 1 compares it as well.
pub(crate) const CODED_PROTOCOL: u32 = 2;

impl Role {
    pub(crate) fn mount(config: &MountConfig) -> Role {
        Role {
            serve: false,
            coded: config.coded_scheme().is_some(),
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: CODED_PROTOCOL,
        }
    }

    fn server() -> Role {
        Role {
            serve: true,
            coded: true,
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: CODED_PROTOCOL,
        }
    }
}

const LAUNCH: &str = "start the server first in one MPMD job: mpirun -np 1 shufflefs serve --source SRC : -np M shufflefs mount --exchange coded --cache-fraction ALPHA ...";

fn list(ranks: &[usize]) -> String {
    let v: Vec<String> = ranks.iter().map(ToString::to_string).collect();
    v.join(", ")
}

/// Phase 1's judgement of the world's roles (the same on every rank, so a message each rank
/// says alike).
pub(crate) fn verdict(roles: &[Role]) -> Result<Layout, String> {
    let servers: Vec<usize> = (roles.iter().enumerate())
        .filter(|(_, r)| r.serve)
        .map(|(i, _)| i)
        .collect();
    let coded: Vec<usize> = (roles.iter().enumerate())
        .filter(|(_, r)| !r.serve && r.coded)
        .map(|(i, _)| i)
        .collect();
    let plain: Vec<usize> = (roles.iter().enumerate())
        .filter(|(_, r)| !r.serve && !r.coded)
        .map(|(i, _)| i)
        .collect();
    if let Some(other) = roles.iter().find(|r| r.version != roles[0].version) {
        return Err(format!(
            "ranks run different shufflefs versions ({} and {}); install the same build everywhere",
            roles[0].version, other.version
        ));
    }
    if servers.is_empty() {
        return match coded.is_empty() {
            true => Ok(Layout::Plain),
            false => Err(format!(
                "--exchange coded needs a `shufflefs serve` rank, and this job has none (world ranks {} mount with --exchange coded); {LAUNCH}",
                list(&coded)
            )),
        };
    }
    if servers != [0] {
        return Err(format!(
            "`shufflefs serve` runs at world ranks {}; exactly one server, world rank 0, is supported: {LAUNCH}",
            list(&servers)
        ));
    }
    if let Some(other) = roles.iter().find(|r| r.protocol != roles[0].protocol) {
        return Err(format!(
            "the server (world rank 0) speaks coded protocol {} and a compute rank {} (a build before 2 ignores a partial cache's kept sets); install the same build everywhere",
            roles[0].protocol, other.protocol
        ));
    }
    if roles.len() == 1 {
        return Err(format!(
            "a `shufflefs serve` rank without compute ranks has nothing to serve; {LAUNCH}"
        ));
    }
    if !plain.is_empty() {
        return Err(format!(
            "world rank 0 is a `shufflefs serve` server, but world ranks {} mount without --exchange coded; start every compute rank with --exchange coded --cache-fraction ALPHA",
            list(&plain)
        ));
    }
    Ok(Layout::Coded)
}

/// Phase 1 on this rank.
pub(crate) fn roles(world: &mut dyn Comm, mine: &Role) -> Result<Layout, CodedError> {
    let bytes = serde_json::to_vec(mine).expect("a role serializes");
    let all = world
        .all_gather(&bytes)
        .map_err(comm("learning the roles of the job's ranks"))?;
    let roles: Vec<Role> = all
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            CodedError::Refused(
                "a rank of this job is not shufflefs, or another version of it".to_string(),
            )
        })?;
    verdict(&roles).map_err(CodedError::Refused)
}

/// Phase 2 on a compute rank: its own communicator.
pub(crate) fn split_compute(world: &mut dyn Comm) -> Result<Box<dyn Comm>, CodedError> {
    world
        .split(COMPUTE_COLOR)
        .map_err(comm("splitting the compute ranks off the server"))
}

/// The run as compute rank 0 describes it to the server (phase 3).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct Offer {
    pub samples: u64,
    pub ranks: u32,
    pub seed: u64,
    pub alpha: f64,
    pub scheme: String,
    pub nu: usize,
    pub communicators: usize,
    pub multicast: String,
    pub epoch: u64,
    pub format: String,
    pub manifest_fingerprint: u32,
    /// The kept sets' room in samples when the compute ranks' caches do not fit
    /// (`plan::coded_keep`); absent: whole caches.
    #[serde(default)]
    pub slots: Option<usize>,
}

impl Offer {
    /// The offer of a coded run (`None` for a partial-local one, which makes none).
    pub(crate) fn new(
        config: &MountConfig,
        plan: &Plan,
        manifest_fingerprint: u32,
        epoch: u64,
    ) -> Option<Offer> {
        let ExchangeMode::Coded {
            scheme,
            nu,
            multicast,
            communicators,
            ..
        } = &config.exchange
        else {
            return None;
        };
        Some(Offer {
            samples: plan.params().samples,
            ranks: plan.params().world,
            seed: plan.params().seed,
            alpha: plan.coded_shares().map_or(0.0, CodedShares::alpha),
            scheme: scheme.name().into(),
            nu: *nu,
            communicators: *communicators,
            multicast: multicast.name().into(),
            epoch,
            format: format!("{:?}", config.format()).to_lowercase(),
            manifest_fingerprint,
            slots: plan.coded_shares().and_then(CodedShares::slots),
        })
    }

    /// The offer's multicast; a refusal goes into the server's verdict (a message).
    fn multicast(&self) -> Result<Multicast, String> {
        match self.multicast.as_str() {
            "ring" => Ok(Multicast::Ring),
            "broadcast" => Ok(Multicast::Broadcast),
            m => Err(format!("unknown multicast {m:?}")),
        }
    }

    fn scheme(&self) -> Result<Scheme, String> {
        match self.scheme.as_str() {
            "uncoded" => Ok(Scheme::Uncoded),
            "coded" => Ok(Scheme::Coded),
            "ubershuffle" => Ok(Scheme::Ubershuffle { nu: self.nu }),
            s => Err(format!("unknown scheme {s:?}")),
        }
    }
}

/// Phase 3 on a compute rank: compute rank 0 sends `offer` (the others pass anything) or
/// the compute ranks' start-up error; on the server's consent, creates the multicast
/// communicators (`routes`: `--communicators`, `--cache-fraction` and the rank count are
/// shared settings, so every rank builds the same set). The start-up error travels to the
/// server as text, so it comes as one.
pub(crate) fn offer(
    world: &mut dyn Comm,
    compute_rank: u32,
    offer: Result<(Offer, Vec<u8>), String>,
    routes: impl FnOnce() -> Result<Communicators, String>,
    multicast: Multicast,
) -> Result<Option<Routes>, CodedError> {
    let failed = offer.is_err();
    let msg = match (compute_rank, offer) {
        (0, Ok((o, manifest))) => {
            let json = serde_json::to_vec(&o).expect("an offer serializes");
            let mut m = vec![0u8];
            m.extend_from_slice(&(json.len() as u64).to_le_bytes());
            m.extend_from_slice(&json);
            m.extend_from_slice(&manifest);
            m
        }
        (0, Err(e)) => [&[1u8][..], e.as_bytes()].concat(),
        _ => Vec::new(),
    };
    world
        .broadcast(1, msg)
        .map_err(comm("sending the settings to the server"))?;
    if failed {
        return Ok(None); // the caller reports its own start-up error; the server has it too
    }
    let all = world
        .all_gather(&[])
        .map_err(comm("hearing from the server"))?;
    let server = match all.first().map(|m| read_consent(m)) {
        Some(Err(why)) => {
            return Err(CodedError::Refused(format!(
                "the coded-shuffle server (world rank 0) refused: {why}"
            )));
        }
        Some(Ok(id)) => id,
        None => None,
    };
    let comms = routes().map_err(CodedError::Refused)?;
    let routes = Routes::create(world, Some(compute_rank as usize), comms, multicast)
        .map_err(comm("creating the multicast communicators"))?;
    Ok(Some(match server {
        Some(id) => routes.with_server(id),
        None => routes,
    }))
}

/// The first byte of the server's consent in phase 3 (a refusal is text, never this byte);
/// the server's process follows (`exchange::coded::liveness`), as JSON.
const CONSENT: u8 = 0;

/// The server's phase-3 answer when it consents.
fn consent(me: &ServerId) -> Vec<u8> {
    let mut m = vec![CONSENT];
    m.extend(serde_json::to_vec(me).expect("a server id serializes"));
    m
}

/// The server's phase-3 answer: its process on consent (if it said which), or why it refused.
fn read_consent(m: &[u8]) -> Result<Option<ServerId>, String> {
    match m.split_first() {
        None => Ok(None),
        Some((&CONSENT, id)) => Ok(serde_json::from_slice(id).ok()),
        Some(_) => Err(String::from_utf8_lossy(m).into_owned()),
    }
}

/// The communicator set of a run (the same on every rank of it). A refusal is a message: the
/// server sends it to the compute ranks in its verdict.
pub(crate) fn communicators(ranks: u32, limit: usize, alpha: f64) -> Result<Communicators, String> {
    Communicators::for_cache(ranks as usize, limit, alpha)
        .map_err(|e| format!("--communicators: {e}"))
}

/// What a compute rank tells the server in phase 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mount {
    Up,
    Failed,
    /// Told to stop during start-up: no compute rank mounts, and the server ends cleanly.
    Stopped,
}

/// Phase 4's word of a rank that was told to stop.
const STOPPED: &[u8] = b"stopped";

/// Phase 4 on a compute rank.
pub(crate) fn mounted(world: &mut dyn Comm, mount: Mount) -> Result<(), CodedError> {
    let mine: &[u8] = match mount {
        Mount::Up => b"",
        Mount::Failed => b"not mounted",
        Mount::Stopped => STOPPED,
    };
    world
        .all_gather(mine)
        .map(|_| ())
        .map_err(comm("telling the server the mounts are up"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(serve: bool, coded: bool) -> Role {
        Role {
            serve,
            coded,
            version: "1".into(),
            protocol: CODED_PROTOCOL,
        }
    }

    #[test]
    fn the_server_consents_with_its_process_or_refuses_with_text() {
        let me = ServerId::mine();
        assert_eq!(read_consent(&consent(&me)), Ok(Some(me)));
        assert_eq!(read_consent(b""), Ok(None));
        assert_eq!(read_consent(b"no: --seed"), Err("no: --seed".to_string()));
    }

    #[test]
    fn the_job_layout_is_judged_with_clear_refusals() {
        let (s, c, p) = (role(true, true), role(false, true), role(false, false));
        assert_eq!(verdict(&[p.clone(), p.clone()]), Ok(Layout::Plain));
        assert_eq!(
            verdict(&[s.clone(), c.clone(), c.clone()]),
            Ok(Layout::Coded)
        );
        let no_server = verdict(&[c.clone(), c.clone()]).unwrap_err();
        assert!(
            no_server.contains("needs a `shufflefs serve` rank"),
            "{no_server}"
        );
        assert!(
            no_server.contains("mpirun -np 1 shufflefs serve"),
            "{no_server}"
        );
        let alone = verdict(std::slice::from_ref(&s)).unwrap_err();
        assert!(alone.contains("without compute ranks"), "{alone}");
        let late = verdict(&[c.clone(), s.clone()]).unwrap_err();
        assert!(late.contains("world rank 0"), "{late}");
        let two = verdict(&[s.clone(), s.clone(), c.clone()]).unwrap_err();
        assert!(two.contains("world ranks 0, 1"), "{two}");
        let mixed = verdict(&[s.clone(), c.clone(), p.clone()]).unwrap_err();
        assert!(
            mixed.contains("world ranks 2 mount without --exchange coded"),
            "{mixed}"
        );
        let mut old = c.clone();
        old.version = "0".into();
        assert!(
            verdict(&[s.clone(), c.clone(), old])
                .unwrap_err()
                .contains("versions")
        );
        // A server from before the kept sets' slots (no protocol in its role) is refused,
        // naming both protocols.
        let old_server: Role =
            serde_json::from_str(r#"{"serve":true,"coded":true,"version":"1"}"#).unwrap();
        let why = verdict(&[old_server, c.clone(), c]).unwrap_err();
        assert!(
            why.contains("coded protocol 0 and a compute rank 2"),
            "{why}"
        );
    }
}
