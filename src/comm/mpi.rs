//! `Comm` over MPI (rsmpi). Only built into a process started by `mpirun`/`srun`.
//!
//! MPI counts are 32-bit, so every transfer is split into chunks of at most `CHUNK` bytes;
//! both sides know the total length in advance (from the plan and the manifest), so the
//! receiver can post matching chunked receives without any size handshake.

use std::sync::atomic::{AtomicBool, Ordering};

use mpi::Threading;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::{Comm, CommError};
use crate::plan::Rank;

const CHUNK: usize = 1 << 30;

/// Whether this process was started by an MPI launcher (Open MPI, MPICH/Hydra, PMIx, Slurm).
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

pub struct MpiComm {
    world: SimpleCommunicator,
    // Dropped last: finalizes MPI.
    _universe: Universe,
}

impl MpiComm {
    /// Initialises MPI on the calling thread, which must be the only one that ever uses it.
    pub fn init() -> Result<MpiComm, CommError> {
        let (universe, granted) = mpi::initialize_with_threading(Threading::Funneled)
            .ok_or_else(|| CommError::Mpi("MPI was already initialised".into()))?;
        if granted < Threading::Funneled {
            return Err(CommError::Mpi(format!(
                "MPI granted threading level {granted:?}, shufflefs needs Funneled"
            )));
        }
        Ok(MpiComm {
            world: universe.world(),
            _universe: universe,
        })
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> Rank {
        self.world.rank() as Rank
    }

    fn size(&self) -> u32 {
        self.world.size() as u32
    }

    fn all_gather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        let mut lens = vec![0u64; self.size() as usize];
        self.world
            .all_gather_into(&(data.len() as u64), &mut lens[..]);
        let mut out = Vec::with_capacity(lens.len());
        for (root, len) in lens.into_iter().enumerate() {
            let mut buf = if root as Rank == self.rank() {
                data.to_vec()
            } else {
                vec![0u8; len as usize]
            };
            for chunk in buf.chunks_mut(CHUNK) {
                self.world
                    .process_at_rank(root as i32)
                    .broadcast_into(chunk);
            }
            out.push(buf);
        }
        Ok(out)
    }

    fn broadcast(&mut self, root: Rank, data: Vec<u8>) -> Result<Vec<u8>, CommError> {
        let root_proc = self.world.process_at_rank(root as i32);
        let mut len = data.len() as u64;
        root_proc.broadcast_into(&mut len);
        let mut buf = if self.rank() == root {
            data
        } else {
            vec![0u8; len as usize]
        };
        for chunk in buf.chunks_mut(CHUNK) {
            root_proc.broadcast_into(chunk);
        }
        Ok(buf)
    }

    fn sendrecv(
        &mut self,
        tag: u16,
        send: Option<(Rank, &[u8])>,
        recv: Option<(Rank, &mut [u8])>,
        abort: &AtomicBool,
    ) -> Result<(), CommError> {
        let tag = i32::from(tag);
        let world = &self.world;
        mpi::request::scope(|scope| {
            let mut rreq = recv.map(|(from, buf)| {
                world
                    .process_at_rank(from as i32)
                    .immediate_receive_into_with_tag(scope, buf, tag)
            });
            let mut sreq = send.map(|(to, data)| {
                world
                    .process_at_rank(to as i32)
                    .immediate_send_with_tag(scope, data, tag)
            });
            // Poll rather than block, so a shutdown can interrupt a peer that never answers.
            let mut idle = 0u32;
            while rreq.is_some() || sreq.is_some() {
                let before = (rreq.is_some(), sreq.is_some());
                rreq = rreq.and_then(|r| r.test().err());
                sreq = sreq.and_then(|r| r.test().err());
                if (rreq.is_some(), sreq.is_some()) != before {
                    idle = 0;
                    continue;
                }
                if abort.load(Ordering::Relaxed) {
                    // MPI cannot withdraw a half-done transfer: leave without finalizing, which
                    // makes the launcher end the job (the other ranks unmount on its SIGTERM).
                    tracing::error!(
                        "exchange abandoned while a peer still expects data; ending the MPI job"
                    );
                    std::process::exit(3);
                }
                // Back off quickly: waiting ranks must not take the CPU from training's
                // readers (or from the peer they wait for) on a busy node.
                idle = idle.saturating_add(1);
                if idle > 64 {
                    let micros = 20u64 << ((idle - 64) / 16).min(6);
                    std::thread::sleep(std::time::Duration::from_micros(micros.min(1000)));
                } else {
                    std::thread::yield_now();
                }
            }
        });
        Ok(())
    }
}
