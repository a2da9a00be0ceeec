//! Messages on standard error, as NCCL prints them: nothing unless
//! `OXCCL_DEBUG` or `NCCL_DEBUG` asks (`WARN`: every failed call with its
//! reason; `INFO`: also communicators made). Written directly, not
//! through a logging subscriber: a C program has none, and this library
//! installs no global state in the program it is linked into.

use std::io::Write;
use std::sync::Mutex;

#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Level {
    Off,
    Warn,
    Info,
}

/// The level read from the environment; `None` until first needed (and
/// after `ncclResetDebugInit`).
static LEVEL: Mutex<Option<Level>> = Mutex::new(None);

fn level() -> Level {
    let mut l = LEVEL.lock().unwrap_or_else(|p| p.into_inner());
    *l.get_or_insert_with(|| {
        oxccl::nccl_env::honour_nccl_names();
        // A bad value is reported by the call that reads the configuration.
        match oxccl::vars::choice("OXCCL_DEBUG").ok().flatten() {
            None | Some("off") => Level::Off,
            Some("error" | "warn") => Level::Warn,
            Some(_) => Level::Info,
        }
    })
}

fn print(tag: &str, message: &str) {
    let _ = writeln!(
        std::io::stderr().lock(),
        "{}:{} NCCL {tag} {message}",
        std::process::id(),
        oxccl_thread_id()
    );
}

/// The calling thread's id (for telling ranks-as-threads apart).
fn oxccl_thread_id() -> i64 {
    // SAFETY: gettid has no preconditions.
    i64::from(unsafe { libc::gettid() })
}

/// A failed call, at `WARN` and above.
pub(crate) fn warn(message: &str) {
    if level() >= Level::Warn {
        print("WARN", message);
    }
}

/// What happened, at `INFO`.
pub(crate) fn info(message: &str) {
    if level() >= Level::Info {
        print("INFO", message);
    }
}

/// `ncclResetDebugInit`: read `OXCCL_DEBUG` / `NCCL_DEBUG` again at the
/// next message.
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {
    *LEVEL.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

/// `ncclResetDebugInit` (NCCL's profiling alias).
#[no_mangle]
pub extern "C" fn pncclResetDebugInit() {
    ncclResetDebugInit()
}

/// `ncclResetDebugInitInternal`: what NVIDIA's library exports under
/// this name is the same reset.
#[no_mangle]
pub extern "C" fn ncclResetDebugInitInternal() {
    ncclResetDebugInit()
}
