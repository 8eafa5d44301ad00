//! What data parallelism needs of a process group: its rank and size, sums and gathers of
//! f32 vectors, and a stop that takes every rank down.

use crate::{Error, HostTensor, Result};

/// A group of processes that train together, one per device: the collective operations
/// [`super::DataParallel`] runs between steps. Implemented over MPI by
/// `Mpi` (feature `mpi`) and, for one process, by [`Single`].
///
/// Every rank must call the collectives in the same order with the same lengths (MPI's
/// rule); a rank that fails must call [`Collective::abort`] rather than return, or the others
/// wait in their next collective forever.
pub trait Collective {
    /// This process's rank, `0..size`.
    fn rank(&self) -> usize;
    /// The number of processes.
    fn size(&self) -> usize;
    /// Replaces `data` with its elementwise sum over every rank.
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()>;
    /// Writes to `out` this rank's block of the elementwise sum over every rank of `data`
    /// (`size` blocks of `out.len()`, in rank order).
    fn reduce_scatter_sum(&self, data: &[f32], out: &mut [f32]) -> Result<()>;
    /// Concatenates every rank's `part` (the same length on every rank) in rank order
    /// into `out` (`size · part.len()` long).
    fn all_gather(&self, part: &[f32], out: &mut [f32]) -> Result<()>;
    /// Every rank's `value`, in rank order.
    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>>;
    /// Replaces `data` on every rank with rank `root`'s.
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()>;
    /// Waits until every rank has called it.
    fn barrier(&self) -> Result<()>;
    /// Ends every process of the group with exit status `code` (MPI_Abort): what a rank
    /// does after an error, so that no other rank waits for it.
    fn abort(&self, code: i32) -> !;
}

/// One process alone: size 1, every collective a copy.
#[derive(Clone, Copy, Debug, Default)]
pub struct Single;

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _data: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn reduce_scatter_sum(&self, data: &[f32], out: &mut [f32]) -> Result<()> {
        check_parts("reduce-scatter", out.len(), data.len(), 1)?;
        out.copy_from_slice(data);
        Ok(())
    }
    fn all_gather(&self, part: &[f32], out: &mut [f32]) -> Result<()> {
        check_parts("all-gather", part.len(), out.len(), 1)?;
        out.copy_from_slice(part);
        Ok(())
    }
    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        Ok(vec![value])
    }
    fn broadcast(&self, _data: &mut [f32], _root: usize) -> Result<()> {
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// The error of a gather or scatter whose whole is not `size` parts long.
pub(crate) fn check_parts(op: &str, part: usize, whole: usize, size: usize) -> Result<()> {
    if part * size != whole {
        return Err(Error::Distributed(format!("{op}: {whole} elements are not {size} ranks' parts of {part}")));
    }
    Ok(())
}

/// Rank `rank`'s rows of a global batch split along its first axis into `size` equal parts
/// (data parallelism's input split).
///
/// Errors: a rank-0 tensor, a first axis that `size` does not divide, or `rank ≥ size`.
pub fn shard_batch(t: &HostTensor, rank: usize, size: usize) -> Result<HostTensor> {
    let dims = t.shape().dims().to_vec();
    let Some(&rows) = dims.first() else {
        return Err(Error::Distributed(format!("shard_batch: a rank-0 tensor {} has no batch axis", t.ty())));
    };
    if size == 0 || rank >= size || rows % size != 0 {
        return Err(Error::Distributed(format!(
            "shard_batch: {} rows of {} do not split into {size} equal parts for rank {rank}",
            rows,
            t.ty()
        )));
    }
    let per = rows / size;
    let row = dims[1..].iter().product::<usize>();
    let mut shape = dims;
    shape[0] = per;
    // Through f64: exact for every element type a batch holds.
    let values = t.to_f64();
    Ok(HostTensor::from_f64(t.dtype(), shape, &values[rank * per * row..(rank + 1) * per * row])?)
}

/// Shard `rank`'s half-open element range of a flat vector of `total` elements split into
/// `size` parts of `ceil(total / size)` (the last ones shorter or empty), and that part
/// length.
pub(crate) fn shard_range(total: usize, rank: usize, size: usize) -> (std::ops::Range<usize>, usize) {
    let part = total.div_ceil(size.max(1));
    let lo = (rank * part).min(total);
    let hi = ((rank + 1) * part).min(total);
    (lo..hi, part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_split_by_rows() {
        let t = HostTensor::new([4, 2], vec![0f32, 1., 2., 3., 4., 5., 6., 7.]).unwrap();
        let r1 = shard_batch(&t, 1, 2).unwrap();
        assert_eq!(r1.shape().dims(), &[2, 2]);
        assert_eq!(r1.as_slice::<f32>().unwrap(), &[4., 5., 6., 7.]);
        let ids = HostTensor::new([4], vec![7i32, 8, 9, 10]).unwrap();
        assert_eq!(shard_batch(&ids, 3, 4).unwrap().as_slice::<i32>().unwrap(), &[10]);
        let err = shard_batch(&t, 0, 3).unwrap_err().to_string();
        assert!(err.contains("4 rows") && err.contains("3 equal parts"), "{err}");
    }

    #[test]
    fn shards_cover_the_vector_once() {
        for (total, size) in [(10, 3), (9, 3), (2, 4), (7, 1)] {
            let mut covered = 0;
            for r in 0..size {
                let (range, part) = shard_range(total, r, size);
                assert_eq!(range.start, covered);
                assert!(range.len() <= part);
                covered = range.end;
            }
            assert_eq!(covered, total);
        }
    }
}
