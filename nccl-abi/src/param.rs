//! NCCL's parameter API (`ncclParamBind`, `ncclParamGet*`,
//! `ncclParamGetParameter`, `ncclParamGetAllParameterKeys`,
//! `ncclParamDumpAll`), and `ncclSetEncryption`.
//!
//! The parameters are NCCL's variables that oxccl reads
//! ([`oxccl::nccl_env::ALIASES`]), by NCCL's name (`NCCL_ALGO`, or
//! `ALGO`): each one's value is what oxccl uses — the `OXCCL_*` variable
//! when set, else NCCL's translated, else empty (oxccl's default). NCCL's
//! other parameters (NVLink, CUDA, CTA settings) mean nothing here and are
//! unknown keys (`ncclInvalidArgument`).

use crate::export;
use crate::result::{run, Failure};
use oxccl::nccl_env::{Alias, ALIASES};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// What an `ncclParamHandle_t` points to.
pub type ncclParamHandle_t = *const Alias;

/// The parameter named `key` (NCCL's name, with or without `NCCL_`).
///
/// # Safety
/// `key` is NULL or a C string.
unsafe fn find(key: *const c_char) -> Result<&'static Alias, Failure> {
    if key.is_null() {
        return Err(Failure::invalid("key is NULL"));
    }
    // SAFETY: the caller's contract.
    let k = unsafe { CStr::from_ptr(key) }.to_string_lossy();
    let full = match k.starts_with("NCCL_") {
        true => k.to_string(),
        false => format!("NCCL_{k}"),
    };
    ALIASES.iter().find(|a| a.nccl == full).ok_or_else(|| {
        Failure::invalid(format!(
            "parameter {k:?} is not one oxccl reads (it reads: {})",
            ALIASES
                .iter()
                .map(|a| a.nccl)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// The value oxccl uses for `a` (empty: its default).
fn value(a: &Alias) -> String {
    oxccl::nccl_env::honour_nccl_names();
    oxccl::vars::raw(a.oxccl).unwrap_or_default()
}

/// The parameter behind handle `h`.
fn bound(h: ncclParamHandle_t) -> Result<&'static Alias, Failure> {
    ALIASES
        .iter()
        .find(|a| std::ptr::eq(*a, h))
        .ok_or_else(|| Failure::invalid("handle is not from ncclParamBind"))
}

thread_local! {
    /// What the string getters last returned on this thread.
    static STR: RefCell<CString> = RefCell::new(CString::default());
    static KEYS: RefCell<(Vec<CString>, Vec<*const c_char>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Keep `s` as this thread's last string; its address.
fn keep(s: String) -> *const c_char {
    STR.with(|k| {
        *k.borrow_mut() = CString::new(s.replace('\0', " ")).unwrap_or_default();
        k.borrow().as_ptr()
    })
}

export! {
    /// `ncclParamBind`: a handle on the parameter `key`.
    fn ncclParamBind / pncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) {
        run("ncclParamBind", || {
            // SAFETY: the caller's contract.
            let a = unsafe { find(key) }?;
            // SAFETY: the caller gives room for a handle.
            unsafe { crate::comm::put("out", out, a as *const Alias) }
        })
    }
}

/// The typed getters: the value as a whole number of the getter's type.
macro_rules! getters {
    ($($name:ident / $alias:ident: $t:ty;)*) => {$(
        export! {
            #[doc = concat!("`", stringify!($name), "`: the parameter as `", stringify!($t), "`.")]
            fn $name / $alias(h: ncclParamHandle_t, out: *mut $t) {
                run(stringify!($name), || {
                    let a = bound(h)?;
                    let v = value(a);
                    let n: $t = v.parse().map_err(|_| Failure::invalid(format!(
                        "{} = {v:?} is not a {}", a.nccl, stringify!($t)
                    )))?;
                    // SAFETY: the caller gives room for the value.
                    unsafe { crate::comm::put("out", out, n) }
                })
            }
        }
    )*};
}

getters! {
    ncclParamGetI8 / pncclParamGetI8: i8;
    ncclParamGetI16 / pncclParamGetI16: i16;
    ncclParamGetI32 / pncclParamGetI32: i32;
    ncclParamGetI64 / pncclParamGetI64: i64;
    ncclParamGetU8 / pncclParamGetU8: u8;
    ncclParamGetU16 / pncclParamGetU16: u16;
    ncclParamGetU32 / pncclParamGetU32: u32;
    ncclParamGetU64 / pncclParamGetU64: u64;
}

export! {
    /// `ncclParamGetStr`: the value as text (valid until this thread's
    /// next string getter).
    fn ncclParamGetStr / pncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) {
        run("ncclParamGetStr", || {
            let v = value(bound(h)?);
            // SAFETY: the caller gives room for a pointer.
            unsafe { crate::comm::put("out", out, keep(v)) }
        })
    }
}

export! {
    /// `ncclParamGet`: the value's bytes (the text, no NUL) into `out`.
    fn ncclParamGet / pncclParamGet(h: ncclParamHandle_t, out: *mut c_void, maxLen: c_int, len: *mut c_int) {
        run("ncclParamGet", || {
            let v = value(bound(h)?);
            let room = crate::comm::count("maxLen", maxLen)?;
            if v.len() > room {
                return Err(Failure::invalid(format!("the value has {} bytes, maxLen is {room}", v.len())));
            }
            if out.is_null() && !v.is_empty() {
                return Err(Failure::invalid("out is NULL"));
            }
            // SAFETY: `out` has `maxLen` >= v.len() bytes (the caller's contract).
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out as *mut u8, v.len()) };
            // SAFETY: the caller gives room for an int.
            unsafe { crate::comm::put("len", len, v.len() as c_int) }
        })
    }
}

export! {
    /// `ncclParamGetParameter`: the value of `key` as text.
    fn ncclParamGetParameter / pncclParamGetParameter(key: *const c_char, value_: *mut *const c_char, valueLen: *mut c_int) {
        run("ncclParamGetParameter", || {
            // SAFETY: the caller's contract.
            let v = value(unsafe { find(key) }?);
            let n = v.len() as c_int;
            // SAFETY: the caller gives room for a pointer and an int.
            unsafe { crate::comm::put("value", value_, keep(v)) }?;
            // SAFETY: as above.
            unsafe { crate::comm::put("valueLen", valueLen, n) }
        })
    }
}

export! {
    /// `ncclParamGetAllParameterKeys`: the keys (valid until this
    /// thread's next call of it).
    fn ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(table: *mut *const *const c_char, tableLen: *mut c_int) {
        run("ncclParamGetAllParameterKeys", || {
            let p = KEYS.with(|k| {
                let mut k = k.borrow_mut();
                k.0 = ALIASES.iter().map(|a| CString::new(a.nccl).unwrap_or_default()).collect();
                k.1 = k.0.iter().map(|s| s.as_ptr()).collect();
                k.1.as_ptr()
            });
            // SAFETY: the caller gives room for a pointer and an int.
            unsafe { crate::comm::put("table", table, p) }?;
            // SAFETY: as above.
            unsafe { crate::comm::put("tableLen", tableLen, ALIASES.len() as c_int) }
        })
    }
}

/// `ncclParamDumpAll`: every parameter and its value on standard error.
#[no_mangle]
pub extern "C" fn ncclParamDumpAll() {
    for a in ALIASES {
        eprintln!("{} = {:?} (as {})", a.nccl, value(a), a.oxccl);
    }
}

/// `ncclParamDumpAll` (NCCL's profiling alias).
#[no_mangle]
pub extern "C" fn pncclParamDumpAll() {
    ncclParamDumpAll()
}

/// NCCL's `ncclEncryptionConfig_t`.
#[repr(C)]
pub struct ncclEncryptionConfig_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub mode: c_int,
    pub psk: *const c_char,
}

export! {
    /// `ncclSetEncryption`: plaintext (`NCCL_ENCRYPTION_MODE_NONE`) is what
    /// oxccl's sockets carry — their rendezvous is authenticated by the
    /// job's secret, their data not encrypted — so a pre-shared key for
    /// TLS (`NCCL_ENCRYPTION_MODE_PSK`) is refused rather than ignored.
    fn ncclSetEncryption / pncclSetEncryption(config: *const ncclEncryptionConfig_t) {
        run("ncclSetEncryption", || {
            // SAFETY: NULL or the caller's struct.
            let c = unsafe { config.as_ref() }.ok_or_else(|| Failure::invalid("config is NULL"))?;
            if c.magic != crate::config::NCCL_API_MAGIC {
                return Err(Failure::invalid(
                    "config is not initialized with NCCL_ENCRYPTION_CONFIG_INITIALIZER",
                ));
            }
            match c.mode {
                0 => Ok(()),
                1 => Err(Failure::usage(
                    "NCCL_ENCRYPTION_MODE_PSK: oxccl does not encrypt its sockets (its \
                     rendezvous is authenticated with the job's secret, OXCCL_SECRET)",
                )),
                m => Err(Failure::invalid(format!("mode {m} is not an ncclEncryptionMode_t"))),
            }
        })
    }
}
