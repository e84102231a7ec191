//! How the ranks of a TCP job find each other with one known address: rank 0 listens at the
//! rendezvous, every rank (rank 0 too) says who it is and where its data listener answers,
//! and once all `world` have, each gets the whole table. What a rank needs to know comes
//! from the environment torchrun and a Kubernetes job set ([`Contract::from_env`]).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::wire::{Hello, Table};

/// How long ranks wait for each other at the rendezvous by default.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);
/// The rendezvous port's offset from `MASTER_PORT` (torch's own store listens on that).
pub const PORT_OFFSET: u16 = 1;

/// Where a TCP job meets and who this rank is in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contract {
    /// `HOST:PORT` of the rendezvous (rank 0's host).
    pub rendezvous: String,
    pub rank: u32,
    pub world: u32,
    /// How long to wait for every rank to arrive.
    pub wait: Duration,
    /// The port this rank's data listener takes (0: any free one).
    pub data_port: u16,
    /// Which job this rank belongs to ([`job_key`]): the rendezvous turns away a rank of
    /// another job that meets at the same address, and goes on waiting for its own.
    pub job: u64,
}

/// The job a rank of `vars` belongs to, the same on every rank of one job: `SHUFFLEFS_JOB`
/// (a secret the launcher gives every rank; `shufflefs.torch.mount` draws one at rank 0 and
/// hands it round), else what every rank of a run is given alike (torchrun's run id,
/// MASTER_PORT, WORLD_SIZE; not MASTER_ADDR, which a Kubeflow PyTorchJob sets to `localhost`
/// on the master pod alone). Hashed (FNV-1a): the hello does not carry the secret itself.
/// It tells jobs apart; it is no authentication (a hello can be replayed).
pub fn job_key(vars: &dyn Fn(&str) -> Option<String>) -> u64 {
    let text = match vars("SHUFFLEFS_JOB") {
        Some(secret) => format!("job\0{secret}"),
        None => ["TORCHELASTIC_RUN_ID", "MASTER_PORT", "WORLD_SIZE"]
            .map(|k| vars(k).unwrap_or_default())
            .join("\0"),
    };
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Contract {
    /// This rank's contract from `vars` (the environment): `RANK` and `WORLD_SIZE`, and the
    /// rendezvous `rendezvous` (`--rendezvous HOST:PORT`) or else `MASTER_ADDR` with
    /// `SHUFFLEFS_PORT`, else `MASTER_PORT` + [`PORT_OFFSET`]. `None` without a rendezvous
    /// (neither the flag nor `MASTER_ADDR`): a job of one. `SHUFFLEFS_RENDEZVOUS_WAIT`
    /// (seconds) and `SHUFFLEFS_DATA_PORT` change the defaults.
    pub fn from_vars(
        rendezvous: Option<&str>,
        vars: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Contract>, String> {
        let rendezvous = match (rendezvous, vars("MASTER_ADDR")) {
            (Some(r), _) => r.to_string(),
            (None, Some(host)) => format!("{}:{}", bracketed(&host), port_of(vars)?),
            (None, None) => return Ok(None),
        };
        let number = |name: &str| -> Result<u32, String> {
            let v = vars(name).ok_or_else(|| {
                format!("the TCP transport needs {name} (torchrun and a Kubernetes job set it; set it by hand otherwise), as it meets the other ranks at {rendezvous}")
            })?;
            v.trim()
                .parse()
                .map_err(|_| format!("{name}={v:?} is not a number"))
        };
        let (rank, world) = (number("RANK")?, number("WORLD_SIZE")?);
        if world == 0 || rank >= world {
            return Err(format!("RANK={rank} must be below WORLD_SIZE={world}"));
        }
        let wait = match vars("SHUFFLEFS_RENDEZVOUS_WAIT") {
            Some(s) => Duration::from_secs(s.trim().parse().map_err(|_| {
                format!("SHUFFLEFS_RENDEZVOUS_WAIT={s:?} is not a number of seconds")
            })?),
            None => DEFAULT_WAIT,
        };
        let data_port = match vars("SHUFFLEFS_DATA_PORT") {
            Some(s) => data_port(&s, vars("LOCAL_RANK").as_deref())?,
            None => 0,
        };
        Ok(Some(Contract {
            rendezvous,
            rank,
            world,
            wait,
            data_port,
            job: job_key(vars),
        }))
    }

    /// [`Contract::from_vars`] on this process's environment.
    pub fn from_env(rendezvous: Option<&str>) -> Result<Option<Contract>, String> {
        Contract::from_vars(rendezvous, &|k| std::env::var(k).ok())
    }
}

/// The data port of `SHUFFLEFS_DATA_PORT=base`: `base` plus `LOCAL_RANK` (torchrun sets it),
/// so the ranks of one host each take their own.
fn data_port(base: &str, local_rank: Option<&str>) -> Result<u16, String> {
    let b: u16 =
        (base.trim().parse()).map_err(|_| format!("SHUFFLEFS_DATA_PORT={base:?} is not a port"))?;
    let l: u16 = match local_rank {
        Some(l) => (l.trim().parse()).map_err(|_| format!("LOCAL_RANK={l:?} is not a number"))?,
        None => 0,
    };
    (b.checked_add(l))
        .ok_or_else(|| format!("SHUFFLEFS_DATA_PORT={b} plus LOCAL_RANK={l} is past the last port"))
}

/// `host` as it goes before `:PORT` (an IPv6 literal in brackets).
fn bracketed(host: &str) -> String {
    match host.contains(':') && !host.starts_with('[') {
        true => format!("[{host}]"),
        false => host.to_string(),
    }
}

fn port_of(vars: &dyn Fn(&str) -> Option<String>) -> Result<u16, String> {
    if let Some(p) = vars("SHUFFLEFS_PORT") {
        return (p.trim().parse()).map_err(|_| format!("SHUFFLEFS_PORT={p:?} is not a port"));
    }
    let p = vars("MASTER_PORT")
        .ok_or("MASTER_ADDR is set without MASTER_PORT: set both, or SHUFFLEFS_PORT")?;
    let port: u16 = (p.trim().parse()).map_err(|_| format!("MASTER_PORT={p:?} is not a port"))?;
    (port.checked_add(PORT_OFFSET))
        .ok_or_else(|| format!("MASTER_PORT={port} leaves no port above it: set SHUFFLEFS_PORT"))
}

/// What a rank takes away from the rendezvous.
pub(super) struct Joined {
    pub listener: TcpListener,
    pub token: u64,
    pub peers: Vec<(SocketAddr, String)>,
}

/// Meets the other ranks of `c` (rank 0 also hosts the rendezvous).
pub(super) fn join(c: &Contract) -> Result<Joined, String> {
    let until = Instant::now() + c.wait;
    let target = resolve(&c.rendezvous)?;
    let server = match c.rank {
        0 => Some(host_rendezvous(c, target, until)?),
        _ => None,
    };
    let mut stream = reach(c, target, until)?;
    let local = stream.local_addr().map_err(|e| e.to_string())?;
    let listener = TcpListener::bind(SocketAddr::new(unspecified(local.ip()), c.data_port))
        .map_err(|e| {
            in_use(
                e,
                c.data_port,
                "SHUFFLEFS_DATA_PORT (each rank takes it plus its LOCAL_RANK)",
            )
        })?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let hello = Hello {
        rank: c.rank,
        world: c.world,
        job: c.job,
        data: SocketAddr::new(local.ip(), port),
        host: hostname(),
    };
    hello
        .write(&mut stream)
        .map_err(|e| format!("the rendezvous at {} closed: {e}", c.rendezvous))?;
    let margin = Duration::from_secs(10);
    let _ = stream.set_read_timeout(Some(
        until.saturating_duration_since(Instant::now()) + margin,
    ));
    let table = Table::read(&mut stream).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            format!("the rendezvous at {} never answered", c.rendezvous)
        }
        _ => format!("the rendezvous at {} failed: {e}", c.rendezvous),
    })?;
    if let Some(s) = server {
        s.join()
            .map_err(|_| "the rendezvous thread panicked".to_string())??;
    }
    match table {
        Table::Refused(why) => Err(why),
        Table::Ranks { token, peers } => Ok(Joined {
            listener,
            token,
            peers,
        }),
    }
}

fn resolve(addr: &str) -> Result<SocketAddr, String> {
    let mut all = addr.to_socket_addrs().map_err(|e| {
        format!("the rendezvous address {addr:?} cannot be resolved ({e}): give HOST:PORT of rank 0's host (MASTER_ADDR, or --rendezvous)")
    })?;
    all.next()
        .ok_or_else(|| format!("the rendezvous address {addr:?} resolves to nothing"))
}

fn unspecified(like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

fn in_use(e: std::io::Error, port: u16, var: &str) -> String {
    match e.kind() {
        ErrorKind::AddrInUse => format!(
            "port {port} on this host is in use (another job, or torch's own store?): set {var} to a free port, the same on every rank"
        ),
        _ => format!("cannot listen on port {port}: {e}"),
    }
}

/// A connection to the rendezvous, tried until `until` (rank 0 may start after the others).
fn reach(c: &Contract, target: SocketAddr, until: Instant) -> Result<TcpStream, String> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(
            &target,
            left.clamp(Duration::from_millis(100), Duration::from_secs(5)),
        ) {
            Ok(s) => return Ok(s),
            Err(_) if Instant::now() + Duration::from_millis(200) < until => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => {
                return Err(format!(
                    "rank {} cannot reach the rendezvous at {} ({target}) after {} s: {e}. Rank 0 listens there: is MASTER_ADDR (or --rendezvous) rank 0's host, is rank 0 started, is the port open between the hosts?",
                    c.rank,
                    c.rendezvous,
                    c.wait.as_secs()
                ));
            }
        }
    }
}

type Server = std::thread::JoinHandle<Result<(), String>>;

/// Rank 0: listens at the rendezvous's port and answers every rank once all have come.
fn host_rendezvous(c: &Contract, target: SocketAddr, until: Instant) -> Result<Server, String> {
    let listener = TcpListener::bind(SocketAddr::new(unspecified(target.ip()), target.port()))
        .map_err(|e| in_use(e, target.port(), "SHUFFLEFS_PORT"))?;
    let (world, job, at) = (c.world, c.job, c.rendezvous.clone());
    Ok(std::thread::spawn(move || {
        serve(listener, (world, job), &at, until)
    }))
}

fn serve(
    listener: TcpListener,
    (world, job): (u32, u64),
    at: &str,
    until: Instant,
) -> Result<(), String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut came: Vec<Option<(TcpStream, Hello)>> = (0..world).map(|_| None).collect();
    let (mut refusal, mut seen_as) = (None, None);
    // Who was turned away (another job, another version), for the message if ranks are missing.
    let mut turned_away: Vec<String> = Vec::new();
    while refusal.is_none() && came.iter().any(Option::is_none) {
        if Instant::now() >= until {
            refusal = Some(missing_ranks(&came, at, &turned_away));
            break;
        }
        let (mut s, _) = match listener.accept() {
            Ok(c) => c,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
        if let Ok(here) = s.local_addr().map(|a| a.ip()) {
            seen_as = seen_as.or((!here.is_loopback()).then_some(here));
        }
        if let Some(h) = hello_of_this_job(&mut s, (world, job), at, &mut turned_away) {
            refusal = admit(&mut came, s, h, world);
        }
    }
    // A rank that reached the rendezvous over loopback (MASTER_ADDR naming this host as
    // 127.0.1.1, as Debian's /etc/hosts does) is on this host: others reach it at the
    // address they reached the rendezvous at.
    if let Some(here) = seen_as {
        for (_, h) in came.iter_mut().flatten() {
            if h.data.ip().is_loopback() {
                h.data.set_ip(here);
            }
        }
    }
    let table = match &refusal {
        Some(why) => Table::Refused(why.clone()),
        None => Table::Ranks {
            token: RandomState::new().build_hasher().finish(),
            peers: (came.iter().flatten())
                .map(|(_, h)| (h.data, h.host.clone()))
                .collect(),
        },
    };
    for (mut s, _) in came.into_iter().flatten() {
        let _ = table.write(&mut s);
    }
    refusal.map_or(Ok(()), Err)
}

/// The hello on `s` if it is from a rank of this job (`job`); a rank of another job, or of
/// another shufflefs version, is told why it is turned away (it would otherwise see the
/// connection close), and noted in `turned_away`.
fn hello_of_this_job(
    s: &mut TcpStream,
    (world, job): (u32, u64),
    at: &str,
    turned_away: &mut Vec<String>,
) -> Option<Hello> {
    let from = s.peer_addr().map_or("?".into(), |a| a.to_string());
    match Hello::read(&mut *s) {
        Ok(h) if h.job == job => return Some(h),
        Ok(h) => {
            let why = format!(
                "rank {} of another job came to the rendezvous at {at}, where a job of {world} ranks meets: give each job a rendezvous port of its own (SHUFFLEFS_PORT, or --rendezvous), or start every rank of one job with the same SHUFFLEFS_JOB / torchrun run",
                h.rank
            );
            let _ = Table::Refused(why).write(s);
            note(
                turned_away,
                format!("rank {} of another job from {from}", h.rank),
            );
        }
        Err(e) if e.kind() == ErrorKind::InvalidData => {
            let _ = Table::Refused(format!("the rendezvous at {at} refused: {e}")).write(s);
            note(turned_away, format!("{from}: {e}"));
        }
        Err(_) => {}
    }
    None
}

/// Why the job cannot start when ranks are missing at the deadline.
fn missing_ranks(came: &[Option<(TcpStream, Hello)>], at: &str, turned_away: &[String]) -> String {
    let missing: Vec<u32> = (0..came.len() as u32)
        .filter(|&r| came[r as usize].is_none())
        .collect();
    let away = match turned_away.is_empty() {
        true => String::new(),
        false => format!(" Turned away meanwhile: {}.", turned_away.join("; ")),
    };
    format!(
        "ranks {} of {} never reached the rendezvous at {at}: were they started, with the same MASTER_ADDR/--rendezvous? (Every rank must use the same transport: ranks under mpirun do not come here.){away}",
        shortened(&missing),
        came.len()
    )
}

/// How many of those turned away the refusal names (a port scanner must not make it long).
const NAMED: usize = 4;

/// Remembers the first few turned away, then that there were more.
fn note(turned_away: &mut Vec<String>, who: String) {
    match turned_away.len() {
        n if n < NAMED => turned_away.push(who),
        NAMED => turned_away.push("and more".into()),
        _ => {}
    }
}

/// `ranks` as a short list: the first few and how many more.
fn shortened(ranks: &[u32]) -> String {
    match ranks.len() {
        n if n <= 16 => format!("{ranks:?}"),
        n => format!("{:?} and {} more", &ranks[..16], n - 16),
    }
}

/// Takes `h` into `came`, or says why the job cannot start.
fn admit(
    came: &mut [Option<(TcpStream, Hello)>],
    s: TcpStream,
    h: Hello,
    world: u32,
) -> Option<String> {
    if h.world != world {
        return Some(format!(
            "rank {} says the job has {} ranks, rank 0 says {world}: every rank must be started with the same WORLD_SIZE",
            h.rank, h.world
        ));
    }
    match came.get_mut(h.rank as usize) {
        None => Some(format!("a rank {} came to a job of {world}", h.rank)),
        Some(Some((_, first))) => Some(format!(
            "two ranks say they are rank {} (from {} and {}): every rank needs its own RANK",
            h.rank, first.data, h.data
        )),
        Some(slot) => {
            *slot = Some((s, h));
            None
        }
    }
}

/// This host's name (ranks with the same name share a host).
pub(super) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its whole length, which is what we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match rc {
        0 => String::from_utf8_lossy(&buf[..end]).into_owned(),
        _ => "localhost".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn contract(vars: &[(&str, &str)], flag: Option<&str>) -> Result<Option<Contract>, String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Contract::from_vars(flag, &|k| m.get(k).cloned())
    }

    #[test]
    fn torchrun_s_environment_makes_a_contract() {
        let env = [
            ("MASTER_ADDR", "node-0"),
            ("MASTER_PORT", "29500"),
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
        ];
        let c = contract(&env, None).unwrap().unwrap();
        assert_eq!(
            (c.rendezvous.as_str(), c.rank, c.world),
            ("node-0:29501", 3, 8)
        );
        let mut env = env.to_vec();
        env.push(("SHUFFLEFS_PORT", "40000"));
        assert_eq!(
            contract(&env, None).unwrap().unwrap().rendezvous,
            "node-0:40000"
        );
        let flagged = contract(&env, Some("10.0.0.1:7000")).unwrap().unwrap();
        assert_eq!(flagged.rendezvous, "10.0.0.1:7000");
        let mut two = env.to_vec();
        two.extend([("SHUFFLEFS_DATA_PORT", "29600"), ("LOCAL_RANK", "1")]);
        assert_eq!(contract(&two, None).unwrap().unwrap().data_port, 29601);
        let v6 = [
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "5"),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
        ];
        assert_eq!(contract(&v6, None).unwrap().unwrap().rendezvous, "[::1]:6");
    }

    #[test]
    fn no_rendezvous_is_a_job_of_one_and_half_a_contract_is_named() {
        assert_eq!(contract(&[("RANK", "0")], None).unwrap(), None);
        let e = contract(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "1")], None).unwrap_err();
        assert!(e.contains("RANK"), "{e}");
        let e = contract(&[("MASTER_ADDR", "h")], None).unwrap_err();
        assert!(e.contains("MASTER_PORT"), "{e}");
        let e = contract(&[("RANK", "4"), ("WORLD_SIZE", "4")], Some("h:1")).unwrap_err();
        assert!(e.contains("below WORLD_SIZE"), "{e}");
        let e = contract(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "65535")], None).unwrap_err();
        assert!(e.contains("SHUFFLEFS_PORT"), "{e}");
    }
}
