//! Phase 2: the same settings on every rank. Each rank sends its list; every rank compares
//! them with rank 0's alike, and rank 0 reports the differences once.

use super::StartError;
use super::agree::PhaseError;
use crate::comm::Comm;
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

/// Rank 0's settings against everyone's: `Err` names what differs from rank 0.
pub(crate) fn compare(
    comm: &mut dyn Comm,
    config: &MountConfig,
) -> Result<Result<(), PhaseError>, StartError> {
    let mine = serde_json::to_vec(&shared_settings(config)).expect("settings serialize");
    let all = comm.all_gather(&mine)?;
    let parse = |bytes: &[u8]| -> Result<Vec<(String, String)>, StartError> {
        serde_json::from_slice(bytes).map_err(|_| StartError::Malformed("settings list"))
    };
    let root = parse(&all[0])?;
    let mut diffs = Vec::new();
    for (rank, bytes) in all.iter().enumerate().skip(1) {
        for ((name, a), (_, b)) in root.iter().zip(&parse(bytes)?) {
            if a != b {
                diffs.push(format!(
                    "rank {rank} was started with {name} {b}, rank 0 with {a}"
                ));
            }
        }
    }
    Ok(match diffs.is_empty() {
        true => Ok(()),
        false => Err(PhaseError::Shared(format!(
            "ranks disagree on settings; start every rank with the same options:\n{}",
            diffs.join("\n")
        ))),
    })
}
