//! `--mem cuda`: the same calls on device memory. Buffers are filled on
//! the host with the same data as host runs, uploaded once, and the
//! collective runs through `oxccl::cuda::Cuda` on the device's memory;
//! the checked run's result is downloaded and checked like a host run's.
//! Each call returns after the device finished it, so the timed loop's
//! wall time is the collectives' time. With `--registered` the buffers are
//! CUDA IPC allocations every rank reaches (`Cuda::alloc_shared`): the
//! `direct` algorithm on the device, no host staging.

use super::{timed, Case, Timed};
use crate::coll::{Coll, Shape};
use oxccl::cuda::cudarc::driver::{result, CudaContext, CudaSlice, CudaStream, DevicePtr};
use oxccl::cuda::Cuda;
use oxccl::selftest::TestElem;
use oxccl::{as_bytes, as_bytes_mut, Communicator, DeviceSharedBuffer, Error, Kind};
use std::sync::Arc;

/// The device of this rank (local rank round robin over the host's GPUs)
/// and a stream the benchmark orders its work on.
pub struct Device<'c> {
    cuda: Cuda<'c>,
    stream: Arc<CudaStream>,
}

fn driver(e: oxccl::cuda::cudarc::driver::DriverError) -> Error {
    Error::Device {
        device: "CUDA".into(),
        detail: e.to_string(),
    }
}

impl<'c> Device<'c> {
    /// `local`: the rank's index among its host's ranks.
    pub fn new(comm: &'c Communicator, local: usize) -> oxccl::Result<Device<'c>> {
        oxccl::cuda::probe()?;
        let gpus = CudaContext::device_count().map_err(driver)?.max(1) as usize;
        let cuda = Cuda::attach(comm, local % gpus)?;
        let stream = cuda.context().new_stream().map_err(driver)?;
        Ok(Device { cuda, stream })
    }

    /// Which GPU, for the preamble.
    pub fn describe(&self) -> String {
        let c = self.cuda.context();
        format!(
            "device {} ({})",
            c.ordinal(),
            c.name().unwrap_or_else(|_| "?".into())
        )
    }

    fn upload(&self, host: &[u8]) -> oxccl::Result<Option<CudaSlice<u8>>> {
        match host.is_empty() {
            true => Ok(None),
            false => self.stream.clone_htod(host).map(Some).map_err(driver),
        }
    }

    fn download(&self, dev: &Option<CudaSlice<u8>>, host: &mut [u8]) -> oxccl::Result<()> {
        if let Some(d) = dev {
            self.stream.memcpy_dtoh(d, host).map_err(driver)?;
            self.stream.synchronize().map_err(driver)?;
        }
        Ok(())
    }

    /// Time and check one direction of one size on device memory.
    pub fn measure<T: TestElem>(
        &self,
        comm: &Communicator,
        args: &crate::Args,
        case: &Case,
        bytes: usize,
        in_place: bool,
    ) -> oxccl::Result<(Timed, Shape)> {
        let kind = match case.coll {
            Coll::AllReduce => Kind::AllReduce,
            Coll::AllGather => Kind::AllGather,
            Coll::ReduceScatter => Kind::ReduceScatter,
            Coll::Broadcast => Kind::Broadcast,
            Coll::Reduce => Kind::Reduce,
            Coll::AllToAll => Kind::AllToAll,
            Coll::SendRecv => {
                return Err(Error::Unsupported(
                    "sendrecv_perf --mem cuda: point-to-point calls on device memory are not implemented yet"
                        .into(),
                ))
            }
        };
        let shape = case.coll.shape(bytes, T::DTYPE.size(), comm.nranks());
        if args.registered {
            return self.measure_shared::<T>(comm, args, case, kind, shape, in_place);
        }
        let mut host = case.coll.buffers::<T>(&shape, comm, case.op, in_place);
        let send = self.upload(as_bytes(&host.send[..]))?;
        let recv = self.upload(as_bytes(&host.recv[..]))?;
        let ptr = |d: &Option<CudaSlice<u8>>| {
            d.as_ref()
                .map_or((0, 0), |d| (d.device_ptr(&self.stream).0, d.len()))
        };
        // In place, reduce_scatter works on the send buffer (its segment
        // `rank` gets the result), the others on the receive buffer.
        let (s, r) = match (in_place, case.coll) {
            (false, _) => (Some(ptr(&send)), ptr(&recv)),
            (true, Coll::ReduceScatter) => (None, ptr(&send)),
            (true, _) => (None, ptr(&recv)),
        };
        let run = || {
            // SAFETY: this function's own device allocations, alive and
            // untouched by anything else until it returns.
            unsafe {
                self.cuda.collective_raw(
                    kind,
                    s,
                    r,
                    T::DTYPE,
                    case.op,
                    case.root,
                    self.stream.cu_stream(),
                )
            }
        };
        run()?;
        let mut wrong = 0;
        if args.check {
            self.download(&send, as_bytes_mut(&mut host.send[..]))?;
            self.download(&recv, as_bytes_mut(&mut host.recv[..]))?;
            wrong = case
                .coll
                .wrong(comm, &shape, &host, case.op, case.root, in_place);
        }
        let timing = timed(comm, args, wrong, run)?;
        Ok((timing, shape))
    }

    /// [`measure`](Self::measure) on shared device buffers.
    fn measure_shared<T: TestElem>(
        &self,
        comm: &Communicator,
        args: &crate::Args,
        case: &Case,
        kind: Kind,
        shape: Shape,
        in_place: bool,
    ) -> oxccl::Result<(Timed, Shape)> {
        let mut host = case.coll.buffers::<T>(&shape, comm, case.op, in_place);
        let mut send = self.cuda.alloc_shared::<T>(shape.send_len)?;
        let mut recv = self.cuda.alloc_shared::<T>(shape.recv_len)?;
        let put = |dst: u64, v: &[T]| -> oxccl::Result<()> {
            if v.is_empty() {
                return Ok(());
            }
            // SAFETY: `dst` is a live shared allocation of `v.len()` elements.
            unsafe { result::memcpy_htod_sync(dst, as_bytes(v)) }.map_err(driver)?;
            self.cuda.context().synchronize().map_err(driver)
        };
        put(send.device_ptr(), &host.send)?;
        put(recv.device_ptr(), &host.recv)?;
        let (op, root) = (case.op, case.root);
        let run = |send: &mut DeviceSharedBuffer<T>, recv: &mut DeviceSharedBuffer<T>| {
            let c = &self.cuda;
            match (in_place, case.coll) {
                (false, _) => c.collective(kind, Some(&*send), recv, op, root, &self.stream),
                (true, Coll::ReduceScatter) => c.collective(
                    kind,
                    None::<&DeviceSharedBuffer<T>>,
                    send,
                    op,
                    root,
                    &self.stream,
                ),
                (true, _) => c.collective(
                    kind,
                    None::<&DeviceSharedBuffer<T>>,
                    recv,
                    op,
                    root,
                    &self.stream,
                ),
            }
        };
        run(&mut send, &mut recv)?;
        let mut wrong = 0;
        if args.check {
            let get = |src: u64, v: &mut [T]| -> oxccl::Result<()> {
                if v.is_empty() {
                    return Ok(());
                }
                // SAFETY: reads `v.len()` elements of a live allocation.
                unsafe { result::memcpy_dtoh_sync(as_bytes_mut(v), src) }.map_err(driver)
            };
            get(send.device_ptr(), &mut host.send)?;
            get(recv.device_ptr(), &mut host.recv)?;
            wrong = case
                .coll
                .wrong(comm, &shape, &host, case.op, case.root, in_place);
        }
        let timing = timed(comm, args, wrong, || run(&mut send, &mut recv))?;
        Ok((timing, shape))
    }
}
