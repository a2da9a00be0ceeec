//! The matrix on CUDA device memory: the same calls and exact data as the
//! host matrix, each buffer uploaded to the device, the collective run on
//! it through [`Cuda`], the result downloaded and checked element by
//! element. Every dtype goes through the raw-address entry
//! ([`Cuda::collective_raw`], what other frameworks use); f32 all_reduce
//! also through the typed one on cudarc slices.

use super::{each_call, prepare, verify, Call, Case, TestElem};
use crate::cuda::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use crate::cuda::Cuda;
use crate::{as_bytes, bf16, f16, ReduceOp};
use std::sync::Arc;

/// The collectives of the device matrix (send/recv and barrier carry no
/// device buffers here).
const CASES: [Case; 6] = Case::BUFFERS;

/// Host bytes on the device (`None` for no bytes: no allocation).
fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> Result<Option<CudaSlice<u8>>, String> {
    if bytes.is_empty() {
        return Ok(None);
    }
    stream
        .clone_htod(bytes)
        .map(Some)
        .map_err(|e| format!("upload: {e}"))
}

fn from_bytes<T: TestElem>(b: &[u8]) -> Vec<T> {
    let mut v = vec![T::default(); b.len() / std::mem::size_of::<T>()];
    crate::as_bytes_mut(&mut v[..]).copy_from_slice(b);
    v
}

fn one<T: TestElem>(cuda: &Cuda, stream: &Arc<CudaStream>, call: &Call) -> Result<(), String> {
    let comm = cuda.communicator();
    let (r, n) = (comm.rank(), comm.nranks());
    let p = prepare::<T>(call, r, n);
    let send = match &p.send {
        Some(s) => Some(upload(stream, as_bytes(&s[..]))?),
        None => None,
    };
    let recv_bytes = as_bytes(&p.recv[..]).len();
    let recv = upload(stream, as_bytes(&p.recv[..]))?;
    let addr = |s: &Option<CudaSlice<u8>>| s.as_ref().map_or(0, |s| s.device_ptr(stream).0);
    let send_arg = send
        .as_ref()
        .map(|s| (addr(s), s.as_ref().map_or(0, |s| s.len())));
    let (case, op, root) = (call.case, call.op(), call.root);
    // SAFETY: the addresses are this test's own allocations on the
    // device, alive until after the call, holding whole elements.
    unsafe {
        cuda.collective_raw(
            case.kind(),
            send_arg,
            (addr(&recv), recv_bytes),
            T::DTYPE,
            op,
            root,
            stream.cu_stream(),
        )
    }
    .map_err(|e| e.to_string())?;
    let got: Vec<T> = match &recv {
        Some(d) => from_bytes(&stream.clone_dtoh(d).map_err(|e| format!("download: {e}"))?),
        None => Vec::new(),
    };
    match verify(call, r, n, &p, &got) {
        Some(d) => Err(format!("device: {}: {d}", call.describe(T::DTYPE, r, n))),
        None => Ok(()),
    }
}

fn check_type<T: TestElem>(
    cuda: &Cuda,
    stream: &Arc<CudaStream>,
    counts: &[usize],
) -> Result<(), String> {
    let n = cuda.communicator().nranks();
    each_call(n, counts, &CASES, |call| one::<T>(cuda, stream, call))
}

/// f32 all_reduce through the typed entry, on cudarc slices, out of place
/// and in place.
fn typed(cuda: &Cuda, stream: &Arc<CudaStream>, count: usize) -> Result<(), String> {
    let comm = cuda.communicator();
    let (r, n) = (comm.rank(), comm.nranks());
    let e = |e: crate::Error| e.to_string();
    let d = |e: crate::cuda::cudarc::driver::DriverError| e.to_string();
    let input: Vec<f32> = super::data(ReduceOp::Sum, r, 0, count);
    let send = stream.clone_htod(&input).map_err(d)?;
    let mut recv = stream.alloc_zeros::<f32>(count).map_err(d)?;
    cuda.all_reduce(&send, &mut recv, ReduceOp::Sum, stream)
        .map_err(e)?;
    let mut both = stream.clone_htod(&input).map_err(d)?;
    cuda.all_reduce_in_place(&mut both, ReduceOp::Sum, stream)
        .map_err(e)?;
    for out in [&recv, &both] {
        let got = stream.clone_dtoh(out).map_err(d)?;
        if let Some(diff) = super::first_diff(&got, |i| super::expected(ReduceOp::Sum, n, i)) {
            return Err(format!("device: rank {r}/{n} typed f32 all_reduce: {diff}"));
        }
    }
    Ok(())
}

/// The device matrix on `cuda`'s device, every dtype, `counts` as the host
/// matrix takes them; work on a stream of its own.
pub fn run_device_matrix(cuda: &Cuda, counts: &[usize]) -> Result<(), String> {
    let stream = cuda.context().new_stream().map_err(|e| e.to_string())?;
    let s = &stream;
    check_type::<i8>(cuda, s, counts)?;
    check_type::<u8>(cuda, s, counts)?;
    check_type::<i32>(cuda, s, counts)?;
    check_type::<u32>(cuda, s, counts)?;
    check_type::<i64>(cuda, s, counts)?;
    check_type::<u64>(cuda, s, counts)?;
    check_type::<f16>(cuda, s, counts)?;
    check_type::<bf16>(cuda, s, counts)?;
    check_type::<f32>(cuda, s, counts)?;
    check_type::<f64>(cuda, s, counts)?;
    for &c in counts.iter().filter(|c| **c > 0) {
        typed(cuda, s, c)?;
    }
    cuda.communicator().barrier().map_err(|e| e.to_string())
}

/// The matrix on device memory every rank reaches directly (CUDA IPC,
/// [`Cuda::alloc_shared`]): all_reduce, all_gather, broadcast and
/// reduce_scatter run the `direct` algorithm on the device engine over
/// peers' memory (checked through `last_algorithm`), the others exchange
/// staged messages; every result checked exactly. Two buffers of the
/// largest size serve every call (prefixes: the same offsets on every
/// rank, as direct access needs).
pub fn run_device_shared_matrix(cuda: &Cuda, counts: &[usize]) -> Result<(), String> {
    let comm = cuda.communicator();
    let n = comm.nranks();
    let most = counts.iter().max().copied().unwrap_or(0).max(1) * n;
    let e = |e: crate::Error| e.to_string();
    check_shared::<f32>(cuda, counts, most).map_err(|m| format!("f32: {m}"))?;
    check_shared::<bf16>(cuda, counts, most).map_err(|m| format!("bf16: {m}"))?;
    check_shared::<i32>(cuda, counts, most).map_err(|m| format!("i32: {m}"))?;
    comm.barrier().map_err(e)
}

fn check_shared<T: TestElem>(cuda: &Cuda, counts: &[usize], most: usize) -> Result<(), String> {
    let comm = cuda.communicator();
    let (r, n) = (comm.rank(), comm.nranks());
    let e = |e: crate::Error| e.to_string();
    let send = cuda.alloc_shared::<T>(most).map_err(e)?;
    let mut recv = cuda.alloc_shared::<T>(most).map_err(e)?;
    let zero_copy = send.is_zero_copy() && recv.is_zero_copy();
    let ctx = cuda.context().clone();
    each_call(n, counts, &CASES, |call| {
        let p = prepare::<T>(call, r, n);
        let (case, op, root) = (call.case, call.op(), call.root);
        let put = |dst: u64, v: &[T]| -> Result<(), String> {
            match v.is_empty() {
                true => Ok(()),
                // SAFETY: `dst` is a live shared allocation of at least
                // `most` elements, larger than any prepared buffer.
                false => unsafe {
                    crate::cuda::cudarc::driver::result::memcpy_htod_sync(dst, as_bytes(v))
                }
                .map_err(|e| e.to_string()),
            }
        };
        if let Some(s) = &p.send {
            put(send.device_ptr(), s)?;
        }
        put(recv.device_ptr(), &p.recv)?;
        let bytes = |v: &[T]| std::mem::size_of_val(v);
        let sr = p
            .send
            .as_ref()
            .map(|s| crate::Buffer::<T>::region(&send).sub(0, bytes(s)));
        let rr = crate::BufferMut::<T>::region_mut(&mut recv).sub(0, bytes(&p.recv));
        // A copy from pageable memory may still be in flight when it
        // returns; the engine's stream does not wait for the default one.
        ctx.synchronize().map_err(|e| e.to_string())?;
        // SAFETY: prefixes of this function's shared buffers, alive and
        // used by nothing else during the call.
        unsafe { comm.collective_regions(case.kind(), sr, rr, T::DTYPE, op, root) }.map_err(e)?;
        let direct = matches!(
            case,
            Case::AllReduce | Case::AllGather | Case::Broadcast | Case::ReduceScatter
        );
        if zero_copy && n > 1 && direct && comm.last_algorithm() != Some("direct") {
            return Err(format!(
                "{case:?} on shared device buffers ran {:?}, not direct",
                comm.last_algorithm()
            ));
        }
        let mut got = vec![T::default(); p.recv.len()];
        if !got.is_empty() {
            // SAFETY: reads `got.len()` elements of the live allocation.
            unsafe {
                crate::cuda::cudarc::driver::result::memcpy_dtoh_sync(
                    crate::as_bytes_mut(&mut got[..]),
                    recv.device_ptr(),
                )
            }
            .map_err(|e| e.to_string())?;
        }
        match verify(call, r, n, &p, &got) {
            Some(d) => Err(format!(
                "shared device: {}: {d}",
                call.describe(T::DTYPE, r, n)
            )),
            None => Ok(()),
        }
    })
}
