//! Frames of the job view: every message is exactly [`FRAME`] bytes, so receives can be
//! posted before anyone knows what comes (the transport matches lengths exactly), and small
//! enough that MPI sends them eagerly (Open MPI's shared-memory eager limit is 4 KiB): a
//! send completes at once whether or not its peer still listens, so nothing the view sends
//! can hold a rank's exit.
//!
//! A frame is a little-endian `u16` length, then that many bytes of JSON, then zeros:
//! `[[age_ms, row], ...]`, as many rows as fit, both up the view's tree (a rank's row and
//! those below it) and down it (the table); a batch of rows takes several frames, and each
//! row stands alone (the receiver merges rows by rank).

use serde::{Deserialize, Serialize};

use super::row::RankRow;

pub(super) const FRAME: usize = 2048;
const HEAD: usize = 2;

/// A row as rank 0 forwards it: how old it was when sent.
#[derive(Serialize, Deserialize)]
pub(super) struct Aged(pub u64, pub RankRow);

fn framed(json: &[u8]) -> Option<Vec<u8>> {
    let len = u16::try_from(json.len()).ok()?;
    if HEAD + json.len() > FRAME {
        return None;
    }
    let mut frame = vec![0u8; FRAME];
    frame[..HEAD].copy_from_slice(&len.to_le_bytes());
    frame[HEAD..HEAD + json.len()].copy_from_slice(json);
    Some(frame)
}

fn body(frame: &[u8]) -> Option<&[u8]> {
    let len = u16::from_le_bytes(frame.get(..HEAD)?.try_into().ok()?) as usize;
    frame.get(HEAD..HEAD + len)
}

/// `row`, or less of it, whichever is first `fits`: without `first_problem`, then without
/// `given_up_peers` as well.
fn slim_until(row: &RankRow, fits: impl Fn(&RankRow) -> bool) -> RankRow {
    let mut row = row.clone();
    if fits(&row) {
        return row;
    }
    row.first_problem = None;
    if !fits(&row) {
        row.given_up_peers.clear();
    }
    row
}

/// Rows going up or down, packed into as few frames as they fit. A bounded row caps its
/// texts' bytes, but JSON escapes a control character in six: a row that then does not fit a
/// frame alone goes without its problem's text, then without its given-up peers too (rather
/// than not at all, which would leave it stale).
pub(super) fn down(rows: &[Aged]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let alone = |a: &Aged| {
        serde_json::to_vec(&[a])
            .ok()
            .and_then(|j| framed(&j))
            .is_some()
    };
    let rows: Vec<Aged> = (rows.iter())
        .map(|a| Aged(a.0, slim_until(&a.1, |r| alone(&Aged(a.0, r.clone())))))
        .collect();
    let mut batch: Vec<&Aged> = Vec::new();
    for row in &rows {
        batch.push(row);
        let fits = serde_json::to_vec(&batch).ok().and_then(|j| framed(&j));
        if fits.is_none() {
            batch.pop();
            if let Some(f) = flush(&batch) {
                frames.push(f);
            }
            batch = vec![row];
        }
    }
    frames.extend(flush(&batch));
    frames
}

fn flush(batch: &[&Aged]) -> Option<Vec<u8>> {
    if batch.is_empty() {
        return None;
    }
    framed(&serde_json::to_vec(batch).ok()?)
}

pub(super) fn read_down(frame: &[u8]) -> Vec<Aged> {
    body(frame)
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rank: u32) -> RankRow {
        RankRow {
            rank,
            host: format!("node{rank:03}"),
            first_problem: Some("p".repeat(200)),
            given_up_peers: (0..32).collect(),
            ..RankRow::default()
        }
        .bounded()
    }

    #[test]
    fn rows_round_trip_in_fixed_frames() {
        let f = down(&[Aged(0, row(7))]);
        assert_eq!((f.len(), f[0].len()), (1, FRAME));
        assert_eq!(read_down(&f[0])[0].1, row(7));
        let table: Vec<Aged> = (0..40).map(|r| Aged(u64::from(r) * 10, row(r))).collect();
        let frames = down(&table);
        assert!(frames.len() > 1 && frames.iter().all(|f| f.len() == FRAME));
        let back: Vec<Aged> = frames.iter().flat_map(|f| read_down(f)).collect();
        assert_eq!(back.len(), 40);
        assert!(back.iter().enumerate().all(|(i, a)| a.1 == row(i as u32)));
        assert_eq!(back[3].0, 30);
        assert!(read_down(&[0xff; 4]).is_empty() && read_down(&[0; 1]).is_empty());
    }

    /// Control characters take six bytes each in JSON: a bounded row may then not fit a
    /// frame; it goes without its problem's text rather than not at all.
    #[test]
    fn a_row_too_long_once_escaped_goes_without_its_problem() {
        let mut big = row(3);
        big.host = "h".repeat(64);
        big.first_problem = Some("\x01".repeat(240));
        big.given_up_peers = vec![u32::MAX; 32];
        let big = big.bounded();
        assert!(framed(&serde_json::to_vec(&big).unwrap()).is_none());
        let back = read_down(&down(&[Aged(0, big.clone())])[0]).remove(0).1;
        assert_eq!(back.first_problem, None);
        assert_eq!((back.rank, back.given_up_peers.len()), (3, 32));
        let frames = down(&[Aged(5, big.clone()), Aged(6, row(4))]);
        let back: Vec<Aged> = frames.iter().flat_map(|f| read_down(f)).collect();
        assert_eq!(back.len(), 2);
        assert_eq!(
            (back[0].1.rank, back[0].1.first_problem.as_deref()),
            (3, None)
        );
    }
}
