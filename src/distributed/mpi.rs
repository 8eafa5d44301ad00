//! [`Collective`] over MPI (rsmpi on the system's Open MPI or MPICH).

use super::collective::{check_parts, Collective};
use crate::{Error, Result};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

/// The processes `mpirun` started: MPI's world communicator. MPI is initialized once per
/// process ([`Mpi::init`]) and finalized when this is dropped.
///
/// MPI's default error handler ends the job on a failed collective, so the collectives here
/// return `Ok` or do not return; a rank that exits or is killed ends the job through
/// `mpirun` (Open MPI stops every other rank and reports which one failed).
pub struct Mpi {
    world: SimpleCommunicator,
    local_rank: usize,
    // Finalizes MPI when dropped, after the communicators.
    _universe: Universe,
}

impl Mpi {
    /// Initializes MPI: errors if it already was in this process.
    pub fn init() -> Result<Mpi> {
        let universe =
            mpi::initialize().ok_or_else(|| Error::Distributed("MPI is already initialized in this process".into()))?;
        let world = universe.world();
        // The ranks on this host: one shared-memory communicator per host.
        let local_rank = world.split_shared(world.rank()).rank() as usize;
        Ok(Mpi { world, local_rank, _universe: universe })
    }

    /// This process's rank among the ranks on its host: the adapter it should take when a
    /// host has several GPUs (`DeviceOptions::adapter`).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi").field("rank", &self.rank()).field("size", &self.size()).finish()
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        let send = data.to_vec();
        self.world.all_reduce_into(&send[..], data, SystemOperation::sum());
        Ok(())
    }

    fn reduce_scatter_sum(&self, data: &[f32], out: &mut [f32]) -> Result<()> {
        check_parts("reduce-scatter", out.len(), data.len(), self.size())?;
        self.world.reduce_scatter_block_into(data, out, SystemOperation::sum());
        Ok(())
    }

    fn all_gather(&self, part: &[f32], out: &mut [f32]) -> Result<()> {
        check_parts("all-gather", part.len(), out.len(), self.size())?;
        self.world.all_gather_into(part, out);
        Ok(())
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let mut out = vec![0u64; self.size()];
        self.world.all_gather_into(&value, &mut out[..]);
        Ok(out)
    }

    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        self.world.process_at_rank(root as i32).broadcast_into(data);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
