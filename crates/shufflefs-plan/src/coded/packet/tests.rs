//! Round trips of hand-made packets, every failure a receiver must see, and properties over
//! seeded placements of every scheme with samples of very different sizes.

use std::collections::BTreeMap;
use std::io;

use proptest::prelude::*;

use super::*;
use crate::coded::{Instance, Scheme, next_instance, plan};
use crate::plan::placement::RandomPlacement;

/// Test bytes: a pure function of (salt, sample, offset).
fn bytes(salt: u64, sample: SampleId, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (salt ^ sample << 32 ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (x >> 56) as u8
        })
        .collect()
}

fn tx(parts: &[(SampleId, Node)]) -> Transmission {
    let mut group: Vec<Node> = parts.iter().map(|&(_, r)| r).collect();
    group.sort_unstable();
    Transmission {
        parts: parts.to_vec(),
        group,
    }
}

fn source(lens: &BTreeMap<SampleId, usize>) -> impl FnMut(SampleId) -> io::Result<Vec<u8>> + '_ {
    move |s| match lens.get(&s) {
        Some(&n) => Ok(bytes(7, s, n)),
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no sample {s}"),
        )),
    }
}

#[test]
fn single_part_packet_is_header_and_plain_bytes() {
    let lens = BTreeMap::from([(9, 1000)]);
    let packet = encode(&tx(&[(9, 3)]), &mut source(&lens)).unwrap();
    assert_eq!(packet.len(), FIXED + PART + 1000);
    assert_eq!(&packet[FIXED + PART..], &bytes(7, 9, 1000)[..]);
    let parts = header(&packet).unwrap();
    assert_eq!(
        parts,
        vec![PartHeader {
            sample: 9,
            receiver: 3,
            len: 1000,
            crc: crc32c::crc32c(&bytes(7, 9, 1000)),
            readable: true
        }]
    );
    assert_eq!(padding(&parts), 0);
    let got = decode(&packet, 3, &mut |_| panic!("a unicast needs no cache")).unwrap();
    assert_eq!(got, vec![(9, bytes(7, 9, 1000))]);
}

#[test]
fn example_2_packet_decodes_at_both_ends_with_unequal_sizes() {
    // d2 + d5 (paper's Example 2): node 0 wants d5 and caches d2, node 2 wants d2, caches d5.
    let lens = BTreeMap::from([(2, 70_001), (5, 13)]);
    let packet = encode(&tx(&[(5, 0), (2, 2)]), &mut source(&lens)).unwrap();
    assert_eq!(packet.len(), FIXED + 2 * PART + 70_001);
    assert_eq!(padding(&header(&packet).unwrap()), 70_001 - 13);
    assert_eq!(packet_len(&[13, 70_001]), packet.len() as u64);
    let mut cache = |s| Some(bytes(7, s, lens[&s]));
    assert_eq!(
        decode(&packet, 0, &mut cache).unwrap(),
        vec![(5, bytes(7, 5, 13))]
    );
    assert_eq!(
        decode(&packet, 2, &mut cache).unwrap(),
        vec![(2, bytes(7, 2, 70_001))]
    );
    // A group member with no part discards the packet without looking at its cache.
    assert_eq!(decode(&packet, 1, &mut |_| panic!()).unwrap(), vec![]);
}

#[test]
fn unreadable_part_only_fails_its_own_receiver() {
    let lens = BTreeMap::from([(1, 500), (3, 800)]); // sample 2 cannot be read
    let t = tx(&[(1, 0), (2, 1), (3, 2)]);
    let Encoded {
        packet,
        unreadable: failed,
    } = encode_report(&t, &mut source(&lens)).unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, 2);
    assert_eq!(failed[0].1.kind(), io::ErrorKind::NotFound);
    let parts = header(&packet).unwrap();
    assert!(!parts[1].readable);
    assert_eq!(packet.len(), FIXED + 3 * PART + 800);
    // Nobody is asked for sample 2, which is not in the payload.
    let mut cache = |s: SampleId| {
        assert_ne!(s, 2);
        Some(bytes(7, s, lens[&s]))
    };
    assert_eq!(
        decode(&packet, 0, &mut cache).unwrap()[0].1,
        bytes(7, 1, 500)
    );
    assert_eq!(
        decode(&packet, 2, &mut cache).unwrap()[0].1,
        bytes(7, 3, 800)
    );
    let err = decode(&packet, 1, &mut cache).unwrap_err();
    assert_eq!(err, DecodeError::Unavailable { sample: 2 });
    assert_eq!(err.wanted(), Some(2));
    // Nothing readable at all still makes a packet every receiver understands.
    let none = encode(&tx(&[(8, 0)]), &mut source(&lens)).unwrap();
    assert_eq!(none.len(), FIXED + PART);
    assert_eq!(
        decode(&none, 0, &mut |_| None),
        Err(DecodeError::Unavailable { sample: 8 })
    );
}

#[test]
fn receivers_never_get_wrong_bytes() {
    let lens = BTreeMap::from([(1, 300), (2, 200)]);
    let packet = encode(&tx(&[(1, 0), (2, 1)]), &mut source(&lens)).unwrap();
    let want = |wanted| Some(wanted);
    // Missing from the cache.
    let err = decode(&packet, 0, &mut |_| None).unwrap_err();
    assert_eq!(
        err,
        DecodeError::NotCached {
            sample: 2,
            wanted: 1
        }
    );
    assert_eq!(err.wanted(), want(1));
    // Cached copy with one flipped byte, or the wrong length.
    let mut bad = bytes(7, 2, 200);
    bad[199] ^= 1;
    assert_eq!(
        decode(&packet, 0, &mut |_| Some(bad.clone())),
        Err(DecodeError::Stale {
            sample: 2,
            wanted: 1
        })
    );
    assert_eq!(
        decode(&packet, 0, &mut |_| Some(bytes(7, 2, 201))),
        Err(DecodeError::Stale {
            sample: 2,
            wanted: 1
        })
    );
    // Payload damaged in transit: the decoded sample fails its CRC.
    let mut hit = packet.clone();
    let at = hit.len() - 1; // byte 299 of sample 1, past sample 2's end
    hit[at] ^= 0x40;
    assert_eq!(
        decode(&hit, 0, &mut |_| Some(bytes(7, 2, 200))),
        Err(DecodeError::Crc { sample: 1 })
    );
    // ... while node 1, whose sample ends before that byte, still decodes.
    assert_eq!(
        decode(&hit, 1, &mut |_| Some(bytes(7, 1, 300))).unwrap()[0].1,
        bytes(7, 2, 200)
    );
}

#[test]
fn malformed_packets_are_named() {
    let lens = BTreeMap::from([(1, 30), (2, 20)]);
    let packet = encode(&tx(&[(1, 0), (2, 1)]), &mut source(&lens)).unwrap();
    let err = |p: &[u8]| header(p).unwrap_err();
    assert_eq!(
        err(&packet[..10]),
        PacketError::Truncated { len: 10, need: 24 }
    );
    assert_eq!(
        err(&packet[..40]),
        PacketError::Truncated { len: 40, need: 72 }
    );
    assert_eq!(
        err(&packet[..packet.len() - 1]),
        PacketError::PayloadLen { got: 29, want: 30 }
    );
    let mut p = packet.clone();
    p[0] = b'X';
    assert!(matches!(err(&p), PacketError::Magic(_)));
    let mut p = packet.clone();
    p[4] = 2;
    assert_eq!(err(&p), PacketError::Version(2));
    // Any header byte flipped after the fixed fields is caught by the header CRC.
    for at in [
        8,
        17,
        FIXED,
        FIXED + 5,
        FIXED + 9,
        FIXED + 17,
        FIXED + PART + 1,
    ] {
        let mut p = packet.clone();
        p[at] ^= 1;
        assert!(header(&p).is_err(), "flip at {at} not caught");
    }
    let mut p = packet.clone();
    p[FIXED + 9] ^= 1;
    assert_eq!(err(&p), PacketError::HeaderCrc);
    assert!(matches!(
        decode(&p, 0, &mut |_| None),
        Err(DecodeError::Malformed(PacketError::HeaderCrc))
    ));
    assert_eq!(
        encode(&tx(&[]), &mut source(&lens)),
        Err(PacketError::Empty)
    );
    assert_eq!(
        encode(&tx(&[(1, 4), (2, 4)]), &mut source(&lens)),
        Err(PacketError::DuplicateReceiver { receiver: 4 })
    );
    assert!(matches!(
        encode(&tx(&[(1, 64)]), &mut source(&lens)),
        Err(PacketError::BadReceiver { .. })
    ));
}

#[test]
fn concatenated_packets_split_back() {
    let lens = BTreeMap::from([(1, 300), (2, 0), (3, 70_000)]);
    let a = encode(&tx(&[(1, 0), (2, 1)]), &mut source(&lens)).unwrap();
    let b = encode(&tx(&[(2, 5)]), &mut source(&lens)).unwrap();
    let c = encode(&tx(&[(3, 2), (1, 4)]), &mut source(&lens)).unwrap();
    let all = [a.clone(), b.clone(), c.clone()].concat();
    assert_eq!(frame_len(&all).unwrap(), a.len());
    assert_eq!(split(&all).unwrap(), vec![&a[..], &b[..], &c[..]]);
    assert_eq!(split(&[]).unwrap(), Vec::<&[u8]>::new());
    assert_eq!(
        split(&all[..all.len() - 1]),
        Err(PacketError::Truncated {
            len: c.len() - 1,
            need: c.len()
        })
    );
    assert!(matches!(split(&all[1..]), Err(PacketError::Magic(_))));
}

#[test]
fn xor_matches_bytewise_xor_at_every_length() {
    for len in 0..300 {
        let a = bytes(1, 1, len);
        let b = bytes(2, 2, len);
        let mut x = a.clone();
        xor_into(&mut x, &b);
        let want: Vec<u8> = a.iter().zip(&b).map(|(p, q)| p ^ q).collect();
        assert_eq!(x, want, "len {len}");
    }
}

/// Sample sizes for one property case: `mode` picks the distribution.
fn size_of(mode: u8, salt: u64, s: SampleId) -> usize {
    let r = (salt ^ s).wrapping_mul(0xD1B5_4A32_D192_ED03) >> 33;
    match mode {
        0 => 0,                                                   // every sample empty
        1 => 4096,                                                // all equal
        2 => (r % 65_537) as usize,                               // uniform 0..=64 KiB, some 0
        _ if r.is_multiple_of(8) => 60_000 + (r % 5000) as usize, // very unequal: few large ...
        _ => (r % 40) as usize,                                   // ... many tiny
    }
}

fn check_scheme(inst: &Instance, scheme: Scheme, mode: u8, salt: u64) -> Result<(), TestCaseError> {
    let src = |s: SampleId| bytes(salt, s, size_of(mode, salt, s));
    let txs = plan(inst, scheme);
    let mut delivered = 0;
    for t in &txs {
        let packet = encode(t, &mut |s| Ok(src(s))).unwrap();
        let parts = header(&packet).unwrap();
        prop_assert_eq!(parts.len(), t.parts.len());
        for &node in &t.group {
            let mut cached = |s: SampleId| inst.cache(node).contains(&s).then(|| src(s));
            let got = decode(&packet, node, &mut cached).unwrap();
            match t.parts.iter().find(|&&(_, r)| r == node) {
                Some(&(s, _)) => {
                    prop_assert_eq!(got, vec![(s, src(s))]);
                    delivered += 1;
                }
                None => prop_assert!(got.is_empty()),
            }
        }
        // A corrupted cached sample is caught, whichever receiver holds it.
        if let [(a, ra), (b, _), ..] = t.parts[..] {
            let mut wrong = |s: SampleId| {
                let mut v = src(s);
                if s == b {
                    match v.first_mut() {
                        Some(x) => *x ^= 0x80,
                        None => v.push(0),
                    }
                }
                Some(v)
            };
            prop_assert_eq!(
                decode(&packet, ra, &mut wrong),
                Err(DecodeError::Stale {
                    sample: b,
                    wanted: a
                })
            );
        }
    }
    prop_assert_eq!(delivered, inst.missing_count());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_missing_demand_decodes_to_the_source_bytes(
        n in 2usize..=8,
        q in 8u32..128,
        alpha_milli in 0u32..=1000,
        seed in any::<u64>(),
        mode in 0u8..4,
        salt in any::<u64>(),
    ) {
        let q = q.max(n as u32);
        let min_alpha = (q as usize).div_ceil(n) as f64 / f64::from(q);
        let alpha = min_alpha + (1.0 - min_alpha) * f64::from(alpha_milli) / 1000.0;
        let mut p = RandomPlacement::new(u64::from(q), n, alpha, seed).unwrap();
        let inst = next_instance(&mut p);
        for scheme in [Scheme::Uncoded, Scheme::Coded, Scheme::Ubershuffle { nu: 2 }] {
            check_scheme(&inst, scheme, mode, salt)?;
        }
    }

    #[test]
    fn a_damaged_payload_never_decodes(
        lens in proptest::collection::vec(0usize..3000, 2..6),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let parts: Vec<(SampleId, Node)> = (0..lens.len()).map(|i| (i as SampleId, i)).collect();
        let len_of: BTreeMap<SampleId, usize> = lens.iter().enumerate().map(|(i, &l)| (i as SampleId, l)).collect();
        let packet = encode(&tx(&parts), &mut source(&len_of)).unwrap();
        let head = FIXED + PART * lens.len();
        prop_assume!(packet.len() > head);
        let at = head + flip.index(packet.len() - head);
        let mut hit = packet.clone();
        hit[at] ^= 1 << bit;
        for (i, &l) in lens.iter().enumerate() {
            let got = decode(&hit, i, &mut |s| Some(bytes(7, s, len_of[&s])));
            if at - head < l {
                prop_assert_eq!(got, Err(DecodeError::Crc { sample: i as SampleId }));
            } else {
                prop_assert_eq!(got.unwrap(), vec![(i as SampleId, bytes(7, i as SampleId, l))]);
            }
        }
    }
}
