//! Ranks as threads of one process over loopback: the conformance checks every transport
//! passes, and what a user gets wrong (a wrong address, a port in use, mismatched ranks).

use std::net::TcpListener;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use super::*;
use crate::comm::conformance;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn contract(port: u16, rank: u32, world: u32) -> Contract {
    Contract {
        rendezvous: format!("127.0.0.1:{port}"),
        rank,
        world,
        wait: Duration::from_secs(20),
        data_port: 0,
        job: 1,
    }
}

/// Runs `body` on each of `world` ranks (threads) meeting at a fresh port.
fn ranks<T: Send + 'static>(
    world: u32,
    body: impl Fn(TcpComm) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let port = free_port();
    let threads: Vec<_> = (0..world)
        .map(|r| {
            let body = body.clone();
            std::thread::spawn(move || body(TcpComm::connect(&contract(port, r, world)).unwrap()))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn four_ranks_over_loopback_pass_what_mpi_passes() {
    ranks(4, |mut c| conformance::four_ranks(&mut c));
}

#[test]
fn one_rank_is_a_world_of_its_own() {
    ranks(1, |mut c| {
        assert_eq!(c.all_gather(b"x").unwrap(), vec![b"x".to_vec()]);
        assert_eq!(c.all_reduce(&[4], Reduce::Sum).unwrap(), [4]);
        let abort = AtomicBool::new(false);
        let mut got = [0u8; 2];
        c.sendrecv(1, Some((0, b"hi")), Some((0, &mut got)), &abort)
            .unwrap();
        assert_eq!(&got, b"hi");
    });
}

#[test]
fn large_messages_and_many_ranks_arrive_whole() {
    let sums = ranks(6, |mut c| {
        let abort = AtomicBool::new(false);
        let (me, n) = (c.rank(), c.size());
        let big = |r: u32| -> Vec<u8> { (0..3 << 20).map(|i: u32| (i ^ r) as u8).collect() };
        let mut got = vec![0u8; 3 << 20];
        let to = (me + 1) % n;
        let from = (me + n - 1) % n;
        c.sendrecv(2, Some((to, &big(me))), Some((from, &mut got)), &abort)
            .unwrap();
        assert!(got == big(from));
        c.all_reduce(&[u64::from(me)], Reduce::Sum).unwrap()
    });
    assert!(sums.iter().all(|s| s == &[15]));
}

#[test]
fn a_message_of_another_length_is_named() {
    let errs = ranks(2, |mut c| {
        let abort = AtomicBool::new(false);
        let other = 1 - c.rank();
        let mut got = [0u8; 3];
        let r = c.sendrecv(3, Some((other, b"four")), Some((other, &mut got)), &abort);
        c.all_reduce(&[0], Reduce::Sum).unwrap();
        r.unwrap_err().to_string()
    });
    assert!(
        errs[0].contains("expected 3 bytes from rank 1, got 4"),
        "{errs:?}"
    );
}

#[test]
fn a_rank_that_leaves_is_a_peer_gone_and_an_abort_leaves_the_transport_sound() {
    ranks(3, |mut c| {
        let abort = AtomicBool::new(false);
        c.all_reduce(&[0], Reduce::Sum).unwrap();
        if c.rank() == 2 {
            return;
        }
        // Rank 2 leaves without sending: a receive from it fails naming it.
        let mut got = [0u8; 1];
        let e = c
            .sendrecv(4, None, Some((2, &mut got)), &abort)
            .unwrap_err();
        assert!(matches!(e, CommError::PeerGone(2)), "{e}");
        // An abort gives up a receive nobody sends; then ranks 0 and 1 still talk.
        let t = c.post(Op::recv(1 - c.rank(), 9, vec![0; 1])).unwrap();
        let gave_up = AtomicBool::new(true);
        let e = c.progress(Duration::from_millis(10), &gave_up).unwrap_err();
        assert!(matches!(e, CommError::Aborted), "{e}");
        c.detach(&[t]);
        let other = 1 - c.rank();
        let mut got = [0u8; 2];
        c.sendrecv(5, Some((other, b"ok")), Some((other, &mut got)), &abort)
            .unwrap();
        assert_eq!(&got, b"ok");
    });
}

#[test]
fn a_wrong_rendezvous_address_is_named_with_the_fix() {
    let mut c = contract(free_port(), 1, 2);
    c.wait = Duration::from_millis(600);
    let e = TcpComm::connect(&c).err().unwrap().to_string();
    assert!(
        e.contains("cannot reach the rendezvous at 127.0.0.1:"),
        "{e}"
    );
    assert!(e.contains("is rank 0 started"), "{e}");
    c.rendezvous = "no-such-host.invalid:5".into();
    let e = TcpComm::connect(&c).err().unwrap().to_string();
    assert!(e.contains("cannot be resolved"), "{e}");
}

#[test]
fn a_port_in_use_is_named_with_the_variable_that_moves_it() {
    let taken = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = TcpComm::connect(&contract(port, 0, 1))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(&format!("port {port} on this host is in use")),
        "{e}"
    );
    assert!(e.contains("SHUFFLEFS_PORT"), "{e}");
}

#[test]
fn ranks_that_disagree_on_the_world_or_share_a_rank_are_refused() {
    let port = free_port();
    let zero = std::thread::spawn(move || TcpComm::connect(&contract(port, 0, 2)).err());
    let one = TcpComm::connect(&contract(port, 1, 3)).err();
    let e = zero.join().unwrap().unwrap().to_string();
    assert!(
        e.contains("rank 1 says the job has 3 ranks, rank 0 says 2"),
        "{e}"
    );
    assert!(one.is_some());
    let port = free_port();
    let zero = std::thread::spawn(move || TcpComm::connect(&contract(port, 0, 3)).err());
    std::thread::sleep(Duration::from_millis(200));
    let a = std::thread::spawn(move || TcpComm::connect(&contract(port, 1, 3)).err());
    let b = TcpComm::connect(&contract(port, 1, 3)).err();
    let e = zero.join().unwrap().unwrap().to_string();
    assert!(e.contains("two ranks say they are rank 1"), "{e}");
    assert!(a.join().unwrap().is_some() && b.is_some());
}

/// Two jobs given one rendezvous (the same SHUFFLEFS_PORT): a rank of the other job is
/// turned away with what to do, and the job meeting there goes on and forms; a rank of
/// another shufflefs version is told so instead of seeing the connection close.
#[test]
fn a_rank_of_another_job_or_version_is_turned_away_and_the_job_goes_on() {
    let port = free_port();
    let zero = std::thread::spawn(move || TcpComm::connect(&contract(port, 0, 2)).map(|_| ()));
    std::thread::sleep(Duration::from_millis(200));
    let mut stranger = contract(port, 1, 2);
    stranger.job = 2;
    let e = TcpComm::connect(&stranger).err().unwrap().to_string();
    assert!(
        e.contains("rank 1 of another job came to the rendezvous"),
        "{e}"
    );
    assert!(e.contains("SHUFFLEFS_PORT"), "{e}");
    let mut old = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut hello = Vec::new();
    wire::Out::default()
        .raw(wire::RENDEZVOUS_MAGIC)
        .u16(wire::VERSION - 1)
        .send(&mut hello)
        .unwrap();
    std::io::Write::write_all(&mut old, &hello).unwrap();
    let answer = wire::Table::read(&mut old).unwrap();
    assert!(
        matches!(&answer, wire::Table::Refused(why) if why.contains("protocol version")),
        "{answer:?}"
    );
    TcpComm::connect(&contract(port, 1, 2)).unwrap();
    zero.join().unwrap().unwrap();
}

/// The job key is what every rank of one job shares: the launcher's secret first, else
/// torchrun's run with the world size.
#[test]
fn the_job_key_is_the_secret_or_the_torchrun_run() {
    let key = |vars: &[(&str, &str)]| {
        let m: std::collections::HashMap<_, _> = vars.iter().copied().collect();
        rendezvous::job_key(&|k| m.get(k).map(|v| v.to_string()))
    };
    let run = [
        ("TORCHELASTIC_RUN_ID", "r1"),
        ("MASTER_ADDR", "h"),
        ("MASTER_PORT", "5"),
    ];
    let mut on_master = run;
    on_master[1].1 = "localhost"; // a PyTorchJob's master pod
    assert_eq!(
        key(&run),
        key(&on_master),
        "MASTER_ADDR may differ between ranks"
    );
    let mut other = run;
    other[0].1 = "r2";
    assert_ne!(key(&run), key(&other));
    let mut secret = run.to_vec();
    secret.push(("SHUFFLEFS_JOB", "s"));
    let mut secret2 = other.to_vec();
    secret2.push(("SHUFFLEFS_JOB", "s"));
    assert_eq!(
        key(&secret),
        key(&secret2),
        "the secret alone names the job"
    );
    assert_ne!(key(&secret), key(&run));
}

#[test]
fn ranks_missing_at_the_rendezvous_are_listed() {
    let mut c = contract(free_port(), 0, 3);
    c.wait = Duration::from_millis(500);
    let e = TcpComm::connect(&c).err().unwrap().to_string();
    assert!(
        e.contains("ranks [1, 2] of 3 never reached the rendezvous"),
        "{e}"
    );
}

/// A long message's send completes only once its receiver took it (MPI's rendezvous): a
/// receiver that posts nothing holds its sender's completions, so the exchange's posted sends
/// bound what waits at the receiver; a short one completes once written (eager).
#[test]
fn long_sends_complete_when_taken_and_short_ones_when_written() {
    const N: usize = 4;
    const LONG: usize = 1 << 20;
    ranks(2, |mut c| {
        let abort = AtomicBool::new(false);
        if c.rank() == 0 {
            let short = c.post(Op::send(1, 4, vec![7; 100])).unwrap();
            let long: Vec<Ticket> = (0..N)
                .map(|i| c.post(Op::send(1, 3, vec![i as u8; LONG])).unwrap())
                .collect();
            let mut done = Vec::new();
            let until = Instant::now() + Duration::from_secs(1);
            while Instant::now() < until {
                done.extend(c.progress(Duration::from_millis(50), &abort).unwrap());
            }
            let done: Vec<Ticket> = done.iter().map(|d| d.ticket).collect();
            assert_eq!(done, [short], "only the short send completed");
            c.all_reduce(&[0], Reduce::Sum).unwrap();
            let mut left: Vec<Ticket> = long.clone();
            while !left.is_empty() {
                let got = c.progress(Duration::from_millis(100), &abort).unwrap();
                left.retain(|t| !got.iter().any(|d| d.ticket == *t));
            }
        } else {
            c.all_reduce(&[0], Reduce::Sum).unwrap();
            let mut short = [0u8; 100];
            c.sendrecv(4, None, Some((0, &mut short)), &abort).unwrap();
            let tickets: Vec<Ticket> = (0..N)
                .map(|_| c.post(Op::recv(0, 3, vec![0; LONG])).unwrap())
                .collect();
            let mut got = std::collections::HashMap::new();
            while got.len() < N {
                for d in c.progress(Duration::from_millis(100), &abort).unwrap() {
                    got.insert(d.ticket, d.buf);
                }
            }
            for (i, t) in tickets.iter().enumerate() {
                assert!(got[t].iter().all(|&b| b == i as u8), "message {i} in order");
            }
        }
        c.all_reduce(&[0], Reduce::Sum).unwrap();
    });
}
