//! `shufflefs status MOUNT`: the job view (`node::jobview`) as a table, read from any rank's
//! `.shufflefs/status`. `--json` prints the `job` object as it is; `--watch` redraws every
//! second until interrupted (on a terminal in place, otherwise as periodic plain tables,
//! so a log keeps every one; with `--json`, one compact object a line). Errors go to stderr
//! (a single look then exits with failure); a reader that goes away (`--watch | head`) ends
//! it quietly. A path that is no mount, or a mount whose daemon is gone, is named as such
//! with the way out ([`unreadable`]); watching, [`GONE_AFTER`] such looks in a row end it
//! with failure, so a watch of a mount that went does not print the same error forever.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::cli::StatusArgs;

pub fn run(args: &StatusArgs) -> ExitCode {
    let terminal = std::io::stdout().is_terminal();
    let mut first = true;
    let mut gone = 0;
    loop {
        // Watching, JSON goes one compact object a line (for `jq` and logs).
        let shown = show(&args.mountpoint, args.json, !args.watch);
        match &shown {
            Err(Look::Gone(e)) if args.watch && gone + 1 == GONE_AFTER => {
                eprintln!("shufflefs status: {e}; stopped watching after {GONE_AFTER} such looks");
                return ExitCode::FAILURE;
            }
            Err(e) => eprintln!("shufflefs status: {}", e.text()),
            Ok(_) => {}
        }
        gone = match &shown {
            Err(Look::Gone(_)) => gone + 1,
            _ => 0,
        };
        let text = shown.as_deref().unwrap_or("");
        let clear = args.watch && terminal;
        // A table after another in a log: a blank line between.
        let gap = args.watch && !terminal && !args.json && !first;
        if print(text, clear, gap).is_err() {
            // The reader went (`--watch | head`): nothing more to say, and nowhere to say it.
            return ExitCode::SUCCESS;
        }
        if !args.watch {
            return match shown {
                Ok(_) => ExitCode::SUCCESS,
                Err(_) => ExitCode::FAILURE,
            };
        }
        first = false;
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Writes one look to stdout: after clearing the screen, or after a blank line.
fn print(text: &str, clear: bool, gap: bool) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if clear {
        write!(out, "\x1b[H\x1b[2J")?;
    }
    if gap && !text.is_empty() {
        writeln!(out)?;
    }
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Failed looks in a row at a mount that is not there (or not served) that end `--watch`.
const GONE_AFTER: u32 = 3;

/// Why one look failed.
#[derive(Debug)]
enum Look {
    /// No status to read: no mount there (any more), or its daemon is gone.
    Gone(String),
    Other(String),
}

impl Look {
    fn text(&self) -> &str {
        match self {
            Look::Gone(e) | Look::Other(e) => e,
        }
    }
}

/// What a failed read of `mount`'s status file says: a path that is no mount names the
/// mount point it wants; a dead mount (its daemon gone) how to unmount it.
fn unreadable(mount: &Path, e: &std::io::Error) -> Look {
    let shown = mount.display();
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) if !mount.exists() => Look::Gone(format!(
            "{shown} does not exist: give the mount point of a shufflefs mount"
        )),
        Some(libc::ENOENT | libc::ENOTDIR) => Look::Gone(format!(
            "{shown} is not a shufflefs mount (no .shufflefs/status); give the mount point"
        )),
        Some(libc::ENOTCONN) => Look::Gone(format!(
            "{shown} is a dead shufflefs mount (its daemon is gone: {e}); unmount it with \
             `fusermount3 -u {shown}`, or for a launched job `shufflefs-teardown --job FILE`"
        )),
        _ => Look::Other(format!(
            "reading {}: {e}",
            mount.join(".shufflefs/status").display()
        )),
    }
}

/// The text for one look at `mount`'s status.
fn show(mount: &Path, json: bool, pretty: bool) -> Result<String, Look> {
    let path = mount.join(".shufflefs/status");
    let text = std::fs::read(&path).map_err(|e| unreadable(mount, &e))?;
    let other = |e: String| Look::Other(e);
    let status: Value =
        serde_json::from_slice(&text).map_err(|e| other(format!("{}: {e}", path.display())))?;
    let Some(job) = status.get("job") else {
        let rank = &status["rank"];
        return Err(other(format!(
            "rank {rank} at {} holds no job view (a daemon before it, or a job of over 64 ranks where only each host's first rank shows it)",
            mount.display()
        )));
    };
    if json {
        let s = match pretty {
            true => serde_json::to_string_pretty(job),
            false => serde_json::to_string(job),
        };
        let mut s = s.map_err(|e| other(e.to_string()))?;
        s.push('\n');
        return Ok(s);
    }
    Ok(table(job, &status["rank"]))
}

const HEAD: [&str; 10] = [
    "RANK", "HOST", "EPOCH", "STAGING", "EXCHANGE", "RATE", "GIVEN-UP", "FALLBACK", "PROBLEMS",
    "CACHE",
];

/// The job as a table, then each rank's first problem.
pub(crate) fn table(job: &Value, from_rank: &Value) -> String {
    let ranks = job["ranks"].as_array().cloned().unwrap_or_default();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let age = now.saturating_sub(job["updated_unix_ms"].as_u64().unwrap_or(now));
    let ended = if job["ended"] == true {
        " (view ended: rank 0 left)"
    } else {
        ""
    };
    let mut out = format!(
        "job of {} ranks, as rank {from_rank} saw it {:.1} s ago{ended}\n",
        ranks.len(),
        age as f64 / 1000.0
    );
    let mut lines = vec![HEAD.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
    lines.extend(ranks.iter().map(cells));
    let widths: Vec<usize> = (0..HEAD.len())
        .map(|c| {
            lines
                .iter()
                .map(|l| l.get(c).map_or(0, String::len))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for line in &lines {
        let cells: Vec<String> = (line.iter().zip(&widths))
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    for r in &ranks {
        if let Some(p) = r["first_problem"].as_str() {
            out.push_str(&format!("rank {}: {}\n", r["rank"], printable(p)));
        }
    }
    out
}

/// `text` with control characters escaped (`\u{1b}`), so a problem's text cannot move the
/// cursor or clear the screen.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

/// One rank's cells; a rank not heard from recently says since when.
fn cells(r: &Value) -> Vec<String> {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let rank = r["rank"].to_string();
    let stale = match r["stale_s"].as_f64() {
        _ if r["left"] == true => Some(" (left)".to_string()),
        s => s.map(|s| format!(" (stale {s:.0} s)")),
    };
    if r.get("host").is_none() {
        let what = format!("no report yet{}", stale.unwrap_or_default());
        return vec![rank, what];
    }
    let (s, x) = (&r["staging"], &r["exchange"]);
    let staging = format!(
        "{}/{} {}",
        n(&s["done"]),
        n(&s["total"]),
        bytes(n(&s["done_bytes"]))
    );
    let exchange = match x["into_epoch"].as_u64() {
        Some(e) => format!(
            "->{e} {}/{}",
            bytes(n(&x["done_bytes"])),
            bytes(n(&x["total_bytes"]))
        ),
        None => "-".into(),
    };
    let rate = x["rate_bytes_per_s"].as_f64().unwrap_or(0.0);
    let given_up: Vec<String> = (r["given_up_peers"].as_array().into_iter().flatten())
        .map(Value::to_string)
        .collect();
    vec![
        rank,
        r["host"].as_str().unwrap_or("?").to_string(),
        format!("{}{}", r["epoch"], stale.unwrap_or_default()),
        staging,
        exchange,
        format!("{}/s", bytes(rate as u64)),
        if given_up.is_empty() {
            "-".into()
        } else {
            given_up.join(",")
        },
        n(&r["source_fallbacks"]).to_string(),
        n(&r["problems"]).to_string(),
        bytes(n(&r["cache_bytes"])),
    ]
}

/// Bytes in decimal units, as `df -H` prints them.
fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_shows_every_rank_and_marks_the_silent_ones() {
        let job = json!({"updated_unix_ms": 0, "ranks": [
            {"rank": 0, "host": "node01", "epoch": 3,
             "staging": {"done": 10, "total": 10, "done_bytes": 2_500_000, "total_bytes": 2_500_000},
             "exchange": {"into_epoch": 4, "done_bytes": 1000, "total_bytes": 2000, "rate_bytes_per_s": 1.5e6},
             "given_up_peers": [1], "source_fallbacks": 2, "problems": 1,
             "first_problem": "bad.jpg: EIO\u{1b}[2J", "cache_bytes": 12},
            {"rank": 1, "stale_s": 4.0},
            {"rank": 2, "host": "node02", "epoch": 3, "left": true}
        ], "ended": true});
        let t = table(&job, &json!(0));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("job of 3 ranks, as rank 0 saw it"));
        assert!(lines[0].ends_with("(view ended: rank 0 left)"));
        assert!(lines[1].starts_with("RANK  HOST"));
        for cell in [
            "node01",
            "10/10 2.5 MB",
            "->4 1.0 kB/2.0 kB",
            "1.5 MB/s",
            "12 B",
        ] {
            assert!(lines[2].contains(cell), "{cell} in {}", lines[2]);
        }
        assert!(lines[3].contains("no report yet (stale 4 s)"));
        assert!(lines[4].contains("3 (left)"), "{}", lines[4]);
        assert_eq!(lines[5], "rank 0: bad.jpg: EIO\\u{1b}[2J");
    }

    #[test]
    fn json_is_compact_when_watched_and_errors_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let e = show(dir.path(), true, true).unwrap_err();
        assert!(e.text().contains("is not a shufflefs mount"), "{e:?}");
        std::fs::create_dir(dir.path().join(".shufflefs")).unwrap();
        let status = json!({"rank": 0, "job": {"updated_unix_ms": 0, "ranks": [{"rank": 0}]}});
        std::fs::write(dir.path().join(".shufflefs/status"), status.to_string()).unwrap();
        let pretty = show(dir.path(), true, true).unwrap();
        let compact = show(dir.path(), true, false).unwrap();
        assert!(pretty.lines().count() > 1);
        assert_eq!(compact.lines().count(), 1);
        assert_eq!(
            serde_json::from_str::<Value>(&compact).unwrap(),
            status["job"]
        );
    }

    #[test]
    fn a_path_that_is_no_mount_or_a_dead_mount_is_named_with_the_way_out() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nowhere");
        let e = show(&missing, false, true).unwrap_err();
        assert!(matches!(e, Look::Gone(_)), "{e:?}");
        assert!(
            e.text().contains("does not exist: give the mount point"),
            "{e:?}"
        );
        let e = show(dir.path(), false, true).unwrap_err();
        let want = format!(
            "{} is not a shufflefs mount (no .shufflefs/status); give the mount point",
            dir.path().display()
        );
        assert_eq!(e.text(), want);
        let dead = std::io::Error::from_raw_os_error(libc::ENOTCONN);
        let e = unreadable(dir.path(), &dead);
        assert!(matches!(e, Look::Gone(_)), "{e:?}");
        let unmount = format!("fusermount3 -u {}", dir.path().display());
        assert!(
            e.text().contains(&unmount) && e.text().contains("shufflefs-teardown"),
            "{e:?}"
        );
    }
}
