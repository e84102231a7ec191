//! The bytes on the TCP transport's sockets: the rendezvous's hello and table, a data
//! connection's hello, and a message's header. Fixed little-endian fields, a length before
//! every variable part; a reader refuses what it does not recognise with a message that says
//! what came instead (a stray connection, another program on the port, another version).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};

/// The first bytes of a rendezvous hello.
pub(super) const RENDEZVOUS_MAGIC: &[u8; 4] = b"SFSR";
/// The first bytes of a data connection's hello.
pub(super) const DATA_MAGIC: &[u8; 4] = b"SFSD";
/// Bumped when any layout below changes: ranks of two versions refuse each other.
/// 2: a rendezvous hello names its job.
pub(super) const VERSION: u16 = 2;
/// A message's header: context, tag, length.
pub(super) const HEADER: usize = 8 + 2 + 8;
/// The longest message a peer may announce (64 GiB: a manifest broadcast is the largest).
pub(super) const MAX_MESSAGE: u64 = 1 << 36;
/// The longest name or address in a hello.
const MAX_TEXT: usize = 4096;

/// What a rank tells the rendezvous.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub rank: u32,
    pub world: u32,
    /// Its job's key (`rendezvous::job_key`).
    pub job: u64,
    /// Where its data listener answers: its address on the interface that reached the
    /// rendezvous, and the listener's port.
    pub data: SocketAddr,
    /// Its host name (ranks with the same name share a host).
    pub host: String,
}

/// What the rendezvous answers every rank: the job's token (which data connections present)
/// and every rank's data address and host name, in rank order; or why the job cannot start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Table {
    Ranks {
        token: u64,
        peers: Vec<(SocketAddr, String)>,
    },
    Refused(String),
}

/// Bytes written in one go (so a hello is one segment).
#[derive(Default)]
pub(super) struct Out(Vec<u8>);

impl Out {
    pub fn u8(mut self, v: u8) -> Out {
        self.0.push(v);
        self
    }
    pub fn u16(mut self, v: u16) -> Out {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Out {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Out {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn raw(mut self, v: &[u8]) -> Out {
        self.0.extend_from_slice(v);
        self
    }
    pub fn text(self, v: &str) -> Out {
        self.u32(v.len() as u32).raw(v.as_bytes())
    }
    pub fn addr(self, a: SocketAddr) -> Out {
        self.text(&a.ip().to_string()).u16(a.port())
    }
    pub fn send(self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.0)?;
        w.flush()
    }
    pub fn bytes(self) -> Vec<u8> {
        self.0
    }
}

/// Fields read one after the other; a short read or a bad field is an `InvalidData` error
/// naming it.
pub(super) struct In<R>(pub R);

impl<R: Read> In<R> {
    pub fn array<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b)?;
        Ok(b)
    }
    pub fn u8(&mut self) -> io::Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> io::Result<u16> {
        self.array().map(u16::from_le_bytes)
    }
    pub fn u32(&mut self) -> io::Result<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub fn u64(&mut self) -> io::Result<u64> {
        self.array().map(u64::from_le_bytes)
    }
    pub fn text(&mut self) -> io::Result<String> {
        let len = self.u32()? as usize;
        if len > MAX_TEXT {
            return Err(invalid(format!("a name of {len} bytes")));
        }
        let mut b = vec![0; len];
        self.0.read_exact(&mut b)?;
        String::from_utf8(b).map_err(|_| invalid("a name that is not UTF-8".into()))
    }
    pub fn addr(&mut self) -> io::Result<SocketAddr> {
        let ip: IpAddr = (self.text()?.parse()).map_err(|_| invalid("a bad address".into()))?;
        Ok(SocketAddr::new(ip, self.u16()?))
    }
    /// The magic and version every hello starts with.
    pub fn preamble(&mut self, magic: &[u8; 4], what: &str) -> io::Result<()> {
        let got: [u8; 4] = self.array()?;
        if &got != magic {
            return Err(invalid(format!(
                "not a shufflefs {what} (it began with {got:?}): another program on this port?"
            )));
        }
        match self.u16()? {
            VERSION => Ok(()),
            v => Err(invalid(format!(
                "a shufflefs {what} of protocol version {v} (this one speaks {VERSION}): every rank must run the same shufflefs"
            ))),
        }
    }
}

/// `text` cut to what a reader takes ([`MAX_TEXT`]), at a character boundary.
fn clipped(text: &str) -> &str {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

pub(super) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

impl Hello {
    pub fn write(&self, w: &mut impl Write) -> io::Result<()> {
        (Out::default().raw(RENDEZVOUS_MAGIC).u16(VERSION))
            .u32(self.rank)
            .u32(self.world)
            .u64(self.job)
            .addr(self.data)
            .text(&self.host)
            .send(w)
    }

    pub fn read(r: impl Read) -> io::Result<Hello> {
        let mut r = In(r);
        r.preamble(RENDEZVOUS_MAGIC, "rendezvous hello")?;
        Ok(Hello {
            rank: r.u32()?,
            world: r.u32()?,
            job: r.u64()?,
            data: r.addr()?,
            host: r.text()?,
        })
    }
}

impl Table {
    pub fn write(&self, w: &mut impl Write) -> io::Result<()> {
        let out = Out::default().raw(RENDEZVOUS_MAGIC).u16(VERSION);
        match self {
            Table::Refused(why) => out.u8(1).text(clipped(why)).send(w),
            Table::Ranks { token, peers } => {
                let mut out = out.u8(0).u64(*token).u32(peers.len() as u32);
                for (addr, host) in peers {
                    out = out.addr(*addr).text(host);
                }
                out.send(w)
            }
        }
    }

    pub fn read(r: impl Read) -> io::Result<Table> {
        let mut r = In(r);
        r.preamble(RENDEZVOUS_MAGIC, "rendezvous answer")?;
        if r.u8()? == 1 {
            return Ok(Table::Refused(r.text()?));
        }
        let token = r.u64()?;
        let n = r.u32()?;
        let peers = (0..n)
            .map(|_| Ok((r.addr()?, r.text()?)))
            .collect::<io::Result<_>>()?;
        Ok(Table::Ranks { token, peers })
    }
}

/// A data connection's first bytes: the job's token and the connecting rank.
pub(super) fn data_hello(token: u64, from: u32) -> Vec<u8> {
    (Out::default().raw(DATA_MAGIC).u16(VERSION))
        .u64(token)
        .u32(from)
        .bytes()
}

/// The rank a data connection says it comes from, if it presents `token`.
pub(super) fn read_data_hello(r: impl Read, token: u64) -> io::Result<u32> {
    let mut r = In(r);
    r.preamble(DATA_MAGIC, "data connection")?;
    match r.u64()? {
        t if t == token => r.u32(),
        _ => Err(invalid(
            "a data connection from another job (its token differs)".into(),
        )),
    }
}

/// A message's header.
pub(super) fn header(ctx: u64, tag: u16, len: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(&ctx.to_le_bytes());
    h[8..10].copy_from_slice(&tag.to_le_bytes());
    h[10..].copy_from_slice(&len.to_le_bytes());
    h
}

/// `(context, tag, length)` of a header.
pub(super) fn parse_header(h: &[u8; HEADER]) -> io::Result<(u64, u16, u64)> {
    let mut r = In(&h[..]);
    let (ctx, tag, len) = (r.u64()?, r.u16()?, r.u64()?);
    match len <= MAX_MESSAGE {
        true => Ok((ctx, tag, len)),
        false => Err(invalid(format!("a message of {len} bytes announced"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellos_and_tables_round_trip() {
        let hello = Hello {
            rank: 3,
            world: 8,
            job: 17,
            data: "10.0.0.4:41234".parse().unwrap(),
            host: "node-4".into(),
        };
        let mut b = Vec::new();
        hello.write(&mut b).unwrap();
        assert_eq!(Hello::read(&b[..]).unwrap(), hello);
        let table = Table::Ranks {
            token: 99,
            peers: vec![("[::1]:5".parse().unwrap(), "a".into())],
        };
        let mut b = Vec::new();
        table.write(&mut b).unwrap();
        assert_eq!(Table::read(&b[..]).unwrap(), table);
        let refused = Table::Refused("no".into());
        let mut b = Vec::new();
        refused.write(&mut b).unwrap();
        assert_eq!(Table::read(&b[..]).unwrap(), refused);
        let long = Table::Refused("é".repeat(MAX_TEXT));
        let mut b = Vec::new();
        long.write(&mut b).unwrap();
        assert!(matches!(Table::read(&b[..]).unwrap(), Table::Refused(w) if w.len() == MAX_TEXT));
        assert_eq!(read_data_hello(&data_hello(7, 2)[..], 7).unwrap(), 2);
        assert!(read_data_hello(&data_hello(7, 2)[..], 8).is_err());
        assert_eq!(parse_header(&header(5, 6, 7)).unwrap(), (5, 6, 7));
    }

    #[test]
    fn a_stranger_is_named() {
        let e = Hello::read(&b"GET / HTTP/1.1\r\n"[..]).unwrap_err();
        assert!(e.to_string().contains("another program"), "{e}");
        let mut b = Vec::new();
        (Out::default().raw(RENDEZVOUS_MAGIC).u16(VERSION + 1))
            .send(&mut b)
            .unwrap();
        let e = Hello::read(&b[..]).unwrap_err();
        assert!(e.to_string().contains("same shufflefs"), "{e}");
    }
}
