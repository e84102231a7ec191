//! Phase 2: the same settings on every rank. Rank 0 broadcasts its list; each rank compares
//! its own with it, and rank 0 reports the differences of all once.

use super::StartError;
use super::agree::PhaseError;
use crate::comm::{Comm, gather_if_any};
use crate::config::{ExchangeMode, MountConfig};

/// The settings every rank must share, as `(name, value)`; a setting a mode does not have
/// reads as that option's default, so lists of any two runs line up.
fn shared_settings(config: &MountConfig) -> Vec<(&'static str, String)> {
    let (exchange, alpha, scheme, nu, communicators, multicast) = match &config.exchange {
        ExchangeMode::Partial { .. } => (
            "partial",
            "(none)".to_string(),
            "(none)".to_string(),
            "(none)".to_string(),
            "(none)".to_string(),
            "(none)",
        ),
        ExchangeMode::Coded {
            alpha,
            scheme,
            nu,
            multicast,
            communicators,
        } => (
            "coded",
            alpha.to_string(),
            scheme.name().to_string(),
            nu.to_string(),
            communicators.to_string(),
            multicast.name(),
        ),
    };
    let source = &config.source_config;
    vec![
        ("--source", config.source.display().to_string()),
        ("--format", format!("{:?}", config.format()).to_lowercase()),
        ("--fraction", config.fraction.to_string()),
        ("--exchange-scope", config.scope().to_string()),
        ("--cache-layout", config.layout.to_string()),
        (
            "--seed",
            config.seed.map_or("(default)".into(), |s| s.to_string()),
        ),
        ("--reset-cache", config.reset_cache.to_string()),
        ("--rescan", config.rescan.to_string()),
        ("--exchange", exchange.to_string()),
        ("--cache-fraction", alpha),
        ("--scheme", scheme),
        ("--nu", nu),
        ("--communicators", communicators),
        ("--multicast", multicast.to_string()),
        ("record settings", source.params().describe()),
        ("--part-size", source.part_size().to_string()),
        ("--replicate", format!("{:?}", config.replicate)),
        ("--equal-shares", config.equal_shares.to_string()),
    ]
}

/// Rank 0's settings against everyone's: `Err` names what differs from rank 0. Rank 0
/// broadcasts its list and each rank compares its own with it; the differences are
/// gathered only when some rank found one (see `comm::gather_if_any`), so an agreeing
/// start moves one list down a tree, not every rank's list to every rank.
pub(crate) fn compare(
    comm: &mut dyn Comm,
    config: &MountConfig,
) -> Result<Result<(), PhaseError>, StartError> {
    let rank = comm.rank();
    let mine = shared_settings(config);
    let sent = match rank {
        0 => serde_json::to_vec(&mine).expect("settings serialize"),
        _ => Vec::new(),
    };
    let root: Vec<(String, String)> = serde_json::from_slice(&comm.broadcast(0, sent)?)
        .map_err(|_| StartError::Malformed("settings list"))?;
    let diffs: Vec<String> = (root.iter().zip(&mine))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((name, a), (_, b))| {
            format!("rank {rank} was started with {name} {b}, rank 0 with {a}")
        })
        .collect();
    let Some(all) = gather_if_any(comm, diffs.join("\n").as_bytes())? else {
        return Ok(Ok(()));
    };
    let lines: Vec<String> = (all.iter())
        .filter(|d| !d.is_empty())
        .map(|d| String::from_utf8_lossy(d).into_owned())
        .collect();
    Ok(Err(PhaseError::Shared(format!(
        "ranks disagree on settings; start every rank with the same options:\n{}",
        lines.join("\n")
    ))))
}
