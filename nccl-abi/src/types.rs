//! `ncclDataType_t` and `ncclRedOp_t`: NCCL's codes are oxccl's for the
//! ten types and five operators both have.

use crate::result::Failure;
use oxccl::{DataType, ReduceOp};

pub type ncclDataType_t = i32;
pub type ncclRedOp_t = i32;

/// `ncclFloat8e4m3` and `ncclFloat8e5m2`: NCCL has them, oxccl not yet.
const FLOAT8: [ncclDataType_t; 2] = [10, 11];
/// `ncclNumOps`: the first operator `ncclRedOpCreatePreMulSum` would make.
pub(crate) const NUM_OPS: ncclRedOp_t = 5;

/// The oxccl type of NCCL type code `t`.
pub fn data_type(t: ncclDataType_t) -> Result<DataType, Failure> {
    if FLOAT8.contains(&t) {
        return Err(Failure::invalid(format!(
            "datatype {t} (float8) is not supported by oxccl"
        )));
    }
    u8::try_from(t)
        .ok()
        .and_then(DataType::from_code)
        .ok_or_else(|| Failure::invalid(format!("datatype {t} is not an ncclDataType_t")))
}

/// The oxccl operator of NCCL operator code `op`.
pub fn red_op(op: ncclRedOp_t) -> Result<ReduceOp, Failure> {
    if op >= NUM_OPS {
        return Err(Failure::invalid(format!(
            "reduction operator {op}: no operator was created with that handle"
        )));
    }
    u8::try_from(op)
        .ok()
        .and_then(ReduceOp::from_code)
        .ok_or_else(|| Failure::invalid(format!("reduction operator {op} is not an ncclRedOp_t")))
}
