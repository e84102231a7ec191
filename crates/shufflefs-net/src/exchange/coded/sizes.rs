//! The sample sizes every rank plans a step with, and the step's byte counts.
//!
//! The server pairs the samples of each packet by size (`coded::plan_by_size`: the longest
//! samples of a set's columns share packets, so little of a packet is zero padding), and
//! every compute rank must re-derive exactly the same packets to know what each one
//! carries. Sizes are not in every manifest (a scanned source lists names only, see
//! `dataset::manifest`), and a rank learns one only by reading the sample, so ranks would
//! not agree. The server therefore learns them (from the manifest where known, else from
//! its source, once per sample for the whole run) and sends every compute rank the sizes of
//! the step's missing samples ([`needed`], the same list on every rank) before the packets:
//! the pairing, the bursts and each rank's `bytes_to_receive` then come from one agreed
//! table. 8 bytes per missing sample and rank, about 1e-4 of 100 KB samples.
//!
//! A sample the server cannot read counts as 0 bytes: a value like any other for the
//! pairing, and its packet says it is unreadable (its receiver asks for it plainly).

use std::collections::BTreeSet;

use crate::coded::packet::packet_len;
use crate::coded::{Instance, Scheme, Transmission, plan_by_size};
use crate::plan::SampleId;

/// Every sample some rank lacks of its next share, ascending: what the sizes are sent for.
pub(crate) fn needed(inst: &Instance) -> Vec<SampleId> {
    let all: BTreeSet<SampleId> = (0..inst.nodes()).flat_map(|i| inst.missing(i)).collect();
    all.into_iter().collect()
}

/// The agreed sizes of one step's missing samples.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StepSizes {
    ids: Vec<SampleId>,
    lens: Vec<u64>,
}

impl StepSizes {
    /// `ids` ascending (as [`needed`] lists them), `lens` in the same order.
    pub(crate) fn new(ids: Vec<SampleId>, lens: Vec<u64>) -> StepSizes {
        assert_eq!(ids.len(), lens.len(), "one size per sample");
        StepSizes { ids, lens }
    }

    /// The size of `id`; 0 for a sample no rank lacks (no packet carries it).
    pub(crate) fn len(&self, id: SampleId) -> u64 {
        self.ids.binary_search(&id).map_or(0, |i| self.lens[i])
    }

    /// The wire form: one `u64` per sample of [`needed`], in its order.
    pub(crate) fn encode(&self) -> Vec<u8> {
        self.lens.iter().flat_map(|l| l.to_le_bytes()).collect()
    }

    /// The sizes of `ids` from their wire form; `None` if it is not one `u64` per id.
    pub(crate) fn decode(ids: Vec<SampleId>, bytes: &[u8]) -> Option<StepSizes> {
        if bytes.len() != ids.len() * 8 {
            return None;
        }
        let lens = (bytes.chunks_exact(8))
            .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
            .collect();
        Some(StepSizes { ids, lens })
    }

    /// The step's packets: `scheme`'s plan with each packet's samples paired by size.
    pub(crate) fn plan(&self, inst: &Instance, scheme: Scheme) -> Vec<Transmission> {
        plan_by_size(inst, scheme, &|s| self.len(s))
    }

    /// The bytes `txs` put on the server's link, headers and padding included.
    #[cfg(test)]
    pub(crate) fn packet_bytes(&self, txs: &[Transmission]) -> u64 {
        let lens = |tx: &Transmission| -> Vec<u64> {
            tx.parts.iter().map(|&(s, _)| self.len(s)).collect()
        };
        txs.iter().map(|tx| packet_len(&lens(tx))).sum()
    }

    /// What the uncoded scheme would send for `inst`: one unicast packet per missing demand.
    pub(crate) fn uncoded_bytes(&self, inst: &Instance) -> u64 {
        (0..inst.nodes())
            .flat_map(|i| inst.missing(i))
            .map(|s| packet_len(&[self.len(s)]))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coded::next_instance;
    use crate::plan::placement::RandomPlacement;

    fn instance() -> Instance {
        let mut p = RandomPlacement::new(4000, 4, 0.5, 9).unwrap();
        p.advance_to(1);
        next_instance(&mut p)
    }

    /// A log-normal size of mean 100 KB and coefficient of variation 0.5, a function of the
    /// id (as `benches/coded_packet.rs` draws them).
    fn varied(s: SampleId) -> u64 {
        let h = |k: u64| {
            let x = (s << 8 ^ k).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let z = (-2.0 * h(1).ln()).sqrt() * (std::f64::consts::TAU * h(2)).cos();
        let var = (1.0f64 + 0.25).ln();
        (100_000.0 * (z * var.sqrt() - var / 2.0).exp()) as u64
    }

    #[test]
    fn sizes_round_trip_and_reject_a_wrong_length() {
        let ids = needed(&instance());
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ascending, no repeats");
        let sizes = StepSizes::new(ids.clone(), ids.iter().map(|&s| varied(s)).collect());
        let back = StepSizes::decode(ids.clone(), &sizes.encode()).unwrap();
        assert_eq!(back, sizes);
        assert_eq!(back.len(ids[3]), varied(ids[3]));
        assert!(StepSizes::decode(ids, &sizes.encode()[1..]).is_none());
    }

    #[test]
    fn size_pairing_sends_under_half_the_uncoded_bytes() {
        let inst = instance();
        let ids = needed(&inst);
        let sizes = StepSizes::new(ids.clone(), ids.iter().map(|&s| varied(s)).collect());
        let scheme = Scheme::Ubershuffle { nu: 2 };
        let by_size = sizes.plan(&inst, scheme);
        crate::coded::verify(&inst, &by_size).unwrap();
        let by_id = crate::coded::plan(&inst, scheme);
        assert_eq!(by_size.len(), by_id.len(), "the same packet count");
        let uncoded = sizes.uncoded_bytes(&inst) as f64;
        let (sized, ids) = (sizes.packet_bytes(&by_size), sizes.packet_bytes(&by_id));
        assert!(sized < ids, "by size {sized}, by id {ids}");
        assert!(sized as f64 <= 0.45 * uncoded, "{sized} of {uncoded}");
    }
}
