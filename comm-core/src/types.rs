//! Element types and reduction operators as the communicator sees them.

use kernels::{bf16, f16, Scalar};
use std::fmt;

/// The element type of a buffer (`ncclDataType_t`). The discriminants
/// are NCCL's numeric codes (`DataType::F32 as u8 == ncclFloat32 == 7`),
/// which are also the wire codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    Bf16 = 9,
}

impl DataType {
    /// Every data type, in code order (`ALL[code]` has that code).
    pub const ALL: [DataType; 10] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
    ];

    /// NCCL's code (`ncclDataType_t`).
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
        )
    }

    /// The type of an NCCL code (`ncclDataType_t`; the wire code).
    pub fn from_code(c: u8) -> Option<DataType> {
        DataType::ALL.get(c as usize).copied()
    }

    /// The name nccl-tests uses (`float`, `bfloat16`, `int8`, ...).
    pub const fn nccl_name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
            DataType::F32 => "float",
            DataType::F64 => "double",
        }
    }

    /// Parse a name: the Rust one (`f32`) or the nccl-tests one (`float`).
    pub fn parse(s: &str) -> Option<DataType> {
        let s = s.to_ascii_lowercase();
        DataType::ALL
            .into_iter()
            .find(|d| d.nccl_name() == s || d.to_string() == s)
            .or(match s.as_str() {
                "char" => Some(DataType::I8),
                "int" => Some(DataType::I32),
                "float16" | "fp16" => Some(DataType::F16),
                "float32" | "fp32" => Some(DataType::F32),
                "float64" => Some(DataType::F64),
                _ => None,
            })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
            DataType::F16 => "f16",
            DataType::Bf16 => "bf16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
        })
    }
}

/// A reduction operator (`ncclRedOp_t`). `Avg` is the sum divided by the
/// number of ranks; integers truncate toward zero like NCCL. The
/// discriminants are NCCL's codes (`ReduceOp::Max as u8 == ncclMax == 2`),
/// which are also the wire codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl ReduceOp {
    /// Every operator, in code order (`ALL[code]` has that code).
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// NCCL's code (`ncclRedOp_t`).
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The kernel operator that combines two contributions.
    pub const fn kernel_op(self) -> kernels::Op {
        match self {
            ReduceOp::Sum | ReduceOp::Avg => kernels::Op::Sum,
            ReduceOp::Prod => kernels::Op::Prod,
            ReduceOp::Min => kernels::Op::Min,
            ReduceOp::Max => kernels::Op::Max,
        }
    }

    /// The operator of an NCCL code (`ncclRedOp_t`; the wire code).
    pub fn from_code(c: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(c as usize).copied()
    }

    /// Parse `sum`, `prod`, `min`, `max`, `avg`.
    pub fn parse(s: &str) -> Option<ReduceOp> {
        ReduceOp::ALL
            .into_iter()
            .find(|o| o.to_string().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        })
    }
}

/// A Rust type that can travel through a collective. The mapping to
/// [`DataType`] is a constant, so the typed API costs nothing over the
/// untyped one.
pub trait Element: Scalar {
    /// The matching data type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$( impl Element for $t { const DTYPE: DataType = DataType::$d; } )*};
}
element!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
         f16 => F16, bf16 => Bf16, f32 => F32, f64 => F64);

/// View a typed slice as bytes.
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: every Element is a plain-old-data number without padding; the
    // byte view covers exactly the slice's memory and borrows it.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// View a typed mutable slice as bytes.
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; every byte pattern is a valid value of every
    // Element type (integers and IEEE floats), so writes cannot break validity.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}

/// Dispatch a generic expression over the Rust type of a [`DataType`].
#[macro_export]
macro_rules! with_dtype {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            $crate::DataType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DataType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DataType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DataType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DataType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DataType::U64 => {
                type $T = u64;
                $body
            }
            $crate::DataType::F16 => {
                type $T = $crate::f16;
                $body
            }
            $crate::DataType::Bf16 => {
                type $T = $crate::bf16;
                $body
            }
            $crate::DataType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DataType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}
