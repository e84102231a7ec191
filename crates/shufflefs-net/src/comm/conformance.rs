//! What every transport must do, as one rank's checks of a world of four: the same checks run
//! under `mpirun -np 4` on `MpiComm` (tests/mpi/comm_mpi.rs) and on four `TcpComm`s over
//! loopback (`comm::tcp`'s tests), so both transports pass the same tests.

use std::sync::atomic::AtomicBool;

use super::{Batch, Comm, Reduce};

/// This rank's part: all-reduce, a batch with every peer, a split by parity with a
/// sub-communicator's collectives and point-to-point, collectives of unequal lengths after
/// it, two tags interleaved. Panics on the first difference; all on one host.
pub fn four_ranks(comm: &mut dyn Comm) {
    let (me, size) = (comm.rank(), comm.size());
    assert_eq!(size, 4);
    assert_eq!(comm.hosts(), [0, 0, 0, 0]);
    let abort = AtomicBool::new(false);

    let v = [u64::from(me), 10 - u64::from(me)];
    assert_eq!(comm.all_reduce(&v, Reduce::Max).unwrap(), [3, 10]);
    assert_eq!(comm.all_reduce(&v, Reduce::Min).unwrap(), [0, 7]);
    assert_eq!(comm.all_reduce(&v, Reduce::Sum).unwrap(), [6, 34]);

    // Everyone to everyone in one batch, one message each way per pair.
    let others: Vec<u32> = (0..size).filter(|&p| p != me).collect();
    let batch = Batch {
        sends: (others.iter())
            .map(|&p| (p, vec![me as u8; 3 + p as usize]))
            .collect(),
        recvs: (others.iter())
            .map(|&p| (p, vec![0; 3 + me as usize]))
            .collect(),
    };
    let done = comm.transfer(5, batch, &abort).unwrap();
    for ((p, got), want) in done.recvs.iter().zip(&others) {
        assert_eq!(p, want);
        assert_eq!(*got, vec![*p as u8; 3 + me as usize]);
    }
    assert_eq!(done.sends.len(), 3, "send buffers come back");

    // Split by parity: two groups of two, numbered in world order.
    let mut sub = comm.split(me % 2).unwrap();
    assert_eq!((sub.rank(), sub.size()), (me / 2, 2));
    assert_eq!(sub.hosts(), [0, 0]);
    let all = sub.all_gather(&[me as u8]).unwrap();
    assert_eq!(all, vec![vec![(me % 2) as u8], vec![(me % 2 + 2) as u8]]);
    let other = 1 - sub.rank();
    let mut got = [0u8; 1];
    let (send, recv) = (Some((other, &[me as u8][..])), Some((other, &mut got[..])));
    sub.sendrecv(6, send, recv, &abort).unwrap();
    assert_eq!(u32::from(got[0]), (me + 2) % 4);
    drop(sub);
    // The world still works after the split.
    assert_eq!(comm.all_gather(&[]).unwrap().len(), 4);
    // Different lengths per rank (one of them empty) come back in rank order.
    let mine: Vec<u8> = (0..me * 1000).map(|i| (i as u8) ^ (me as u8)).collect();
    let all = comm.all_gather(&mine).unwrap();
    for (r, got) in all.iter().enumerate() {
        let want: Vec<u8> = (0..r as u32 * 1000)
            .map(|i| (i as u8) ^ (r as u8))
            .collect();
        assert_eq!(*got, want, "rank {r}'s part");
    }
    // A broadcast from every root.
    for root in 0..size {
        let data = vec![root as u8; 10 + root as usize];
        let sent = if me == root { data.clone() } else { Vec::new() };
        assert_eq!(comm.broadcast(root, sent).unwrap(), data);
    }
    // Two tags between one pair, posted in the other order on the receiving side.
    let (next, prev) = ((me + 1) % size, (me + size - 1) % size);
    let sends = [(next, &b"seven"[..])];
    let mut a = [0u8; 5];
    let mut b = [0u8; 4];
    comm.sendrecv_many(7, &sends, &mut [], &abort).unwrap();
    comm.sendrecv_many(
        8,
        &[(next, &b"ei8t"[..])],
        &mut [(prev, &mut b[..])],
        &abort,
    )
    .unwrap();
    comm.sendrecv_many(7, &[], &mut [(prev, &mut a[..])], &abort)
        .unwrap();
    assert_eq!((&a, &b), (b"seven", b"ei8t"));
    // Everybody is done before anybody leaves.
    comm.all_reduce(&[1], Reduce::Sum).unwrap();
}
