//! `ncclRedOpCreatePreMulSum` / `ncclRedOpDestroy`: an operator that
//! multiplies each rank's input by a scalar, then sums.
//!
//! Operators belong to a communicator and a data type, numbered from
//! `ncclNumOps` (5) up. A call with one runs as a sum over the scaled
//! input: out of place the input is scaled into scratch memory (the
//! caller's send buffer is read only), in place it is scaled where it is
//! (it is overwritten by the result anyway). The scalar is read when the
//! operator is made (`ncclScalarHostImmediate`) or when each call runs
//! (`ncclScalarDevice`: with host memory, a pointer the program keeps
//! valid and may change between calls).

use crate::comm::{handle, ncclComm_t, put};
use crate::export;
use crate::result::{run, Failure};
use crate::types::{data_type, ncclDataType_t, ncclRedOp_t, red_op, NUM_OPS};
use half::{bf16, f16};
use oxccl::{DataType, ReduceOp};
use std::ffi::{c_int, c_void};

/// `ncclScalarResidence_t`.
pub const ncclScalarDevice: c_int = 0;
pub const ncclScalarHostImmediate: c_int = 1;

/// Where the scalar is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scalar {
    /// Its bytes, read when the operator was made.
    Value([u8; 8]),
    /// Its address, read when each call runs.
    At(usize),
}

impl Scalar {
    /// The scalar's bytes now (`size` of them).
    fn bytes(&self, size: usize) -> [u8; 8] {
        match *self {
            Scalar::Value(b) => b,
            Scalar::At(p) => {
                let mut b = [0u8; 8];
                // SAFETY: the program keeps the scalar valid while calls
                // with the operator run (ncclScalarDevice's contract);
                // `size` is the operator's data type's.
                unsafe { std::ptr::copy_nonoverlapping(p as *const u8, b.as_mut_ptr(), size) };
                b
            }
        }
    }
}

/// One operator made on a communicator.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreMulSum {
    dtype: DataType,
    scalar: Scalar,
}

/// A communicator's operators: handle `NUM_OPS + i` is entry `i`.
#[derive(Default)]
pub(crate) struct Ops(Vec<Option<PreMulSum>>);

/// What operator `op` means on `comm` for data of `dtype`: a built-in one,
/// or a sum whose input is scaled first.
///
/// # Safety
/// `comm` is NULL or from this library, not destroyed.
pub(crate) unsafe fn resolve(
    comm: ncclComm_t,
    op: ncclRedOp_t,
    dtype: DataType,
) -> Result<(ReduceOp, Option<Scalar>), Failure> {
    if op < NUM_OPS {
        return Ok((red_op(op)?, None));
    }
    // SAFETY: the caller's contract.
    let h = unsafe { handle(comm) }?;
    let ops = h.ops.lock().unwrap_or_else(|p| p.into_inner());
    let made = usize::try_from(op - NUM_OPS)
        .ok()
        .and_then(|i| ops.0.get(i).copied().flatten())
        .ok_or_else(|| {
            Failure::invalid(format!(
                "reduction operator {op}: no operator with that handle exists on this communicator"
            ))
        })?;
    if made.dtype != dtype {
        return Err(Failure::invalid(format!(
            "reduction operator {op} was made for {:?}, used with {dtype:?}",
            made.dtype
        )));
    }
    Ok((ReduceOp::Sum, Some(made.scalar)))
}

/// Multiply the `dtype` elements of `bytes` (aligned) by `scalar`.
///
/// # Safety
/// `addr .. addr + len` is memory of whole, aligned `dtype` elements that
/// nothing else uses meanwhile.
pub(crate) unsafe fn scale(addr: usize, len: usize, dtype: DataType, scalar: Scalar) {
    let s = scalar.bytes(dtype.size());
    macro_rules! each {
        ($t:ty, $mul:expr) => {{
            let s = <$t>::from_ne_bytes(s[..std::mem::size_of::<$t>()].try_into().unwrap());
            // SAFETY: the caller's contract.
            let xs = unsafe {
                std::slice::from_raw_parts_mut(addr as *mut $t, len / std::mem::size_of::<$t>())
            };
            let mul = $mul;
            for x in xs {
                *x = mul(*x, s);
            }
        }};
    }
    match dtype {
        DataType::I8 => each!(i8, i8::wrapping_mul),
        DataType::U8 => each!(u8, u8::wrapping_mul),
        DataType::I32 => each!(i32, i32::wrapping_mul),
        DataType::U32 => each!(u32, u32::wrapping_mul),
        DataType::I64 => each!(i64, i64::wrapping_mul),
        DataType::U64 => each!(u64, u64::wrapping_mul),
        DataType::F16 => each!(f16, |x: f16, s: f16| f16::from_f32(x.to_f32() * s.to_f32())),
        DataType::Bf16 => each!(bf16, |x: bf16, s: bf16| bf16::from_f32(
            x.to_f32() * s.to_f32()
        )),
        DataType::F32 => each!(f32, |x: f32, s: f32| x * s),
        DataType::F64 => each!(f64, |x: f64, s: f64| x * s),
    }
}

export! {
    /// `ncclRedOpCreatePreMulSum`: an operator for `comm` and `datatype`
    /// that multiplies each input by `*scalar`, then sums; its handle in
    /// `*op`.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut ncclRedOp_t,
        scalar: *mut c_void,
        datatype: ncclDataType_t,
        residence: c_int,
        comm: ncclComm_t,
    ) {
        run("ncclRedOpCreatePreMulSum", || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            let dtype = data_type(datatype)?;
            if scalar.is_null() {
                return Err(Failure::invalid("scalar is NULL"));
            }
            let scalar = match residence {
                ncclScalarHostImmediate => {
                    let mut b = [0u8; 8];
                    // SAFETY: non-null; the caller's scalar is one element
                    // of `datatype`.
                    unsafe { std::ptr::copy_nonoverlapping(scalar as *const u8, b.as_mut_ptr(), dtype.size()) };
                    Scalar::Value(b)
                }
                ncclScalarDevice => Scalar::At(scalar as usize),
                r => return Err(Failure::invalid(format!("residence {r} is not an ncclScalarResidence_t"))),
            };
            let mut ops = h.ops.lock().unwrap_or_else(|p| p.into_inner());
            let i = crate::store(&mut ops.0, PreMulSum { dtype, scalar });
            let handle = c_int::try_from(i)
                .ok()
                .and_then(|i| i.checked_add(NUM_OPS))
                .ok_or_else(|| Failure::invalid("too many reduction operators on this communicator"))?;
            // SAFETY: the caller gives room for an operator.
            unsafe { put("op", op, handle) }
        })
    }
}

export! {
    /// `ncclRedOpDestroy`: forget operator `op` of `comm` (its handle may
    /// be given out again).
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) {
        run("ncclRedOpDestroy", || {
            // SAFETY: the caller's contract.
            let h = unsafe { handle(comm) }?;
            if op < NUM_OPS {
                return Err(Failure::invalid(format!("operator {op} is built in, not made")));
            }
            let mut ops = h.ops.lock().unwrap_or_else(|p| p.into_inner());
            match usize::try_from(op - NUM_OPS).ok().and_then(|i| ops.0.get_mut(i)) {
                Some(slot @ Some(_)) => {
                    *slot = None;
                    Ok(())
                }
                _ => Err(Failure::invalid(format!(
                    "operator {op} was not made on this communicator (or was destroyed)"
                ))),
            }
        })
    }
}
