//! A small safe layer over `ibverbs::ffi` (libibverbs): exactly the verbs
//! this transport uses, each object owning its handle and freeing it on drop.
//!
//! The `ibverbs` crate's own safe layer creates completion queues without a
//! completion channel, hides the `ibv_qp` pointer and posts only plain SEND,
//! so this module binds what the transport needs directly: completion
//! channels (so a waiting rank sleeps in `poll(2)`), RDMA WRITE WITH
//! IMMEDIATE, memory registration of memory we did not allocate, and QP state
//! changes with every attribute. `ibv_post_send`, `ibv_post_recv`,
//! `ibv_poll_cq` and `ibv_req_notify_cq` are `static inline` in `verbs.h`;
//! they are reached through the context's `ops` table, as `verbs.h` does.

use ibverbs_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::Arc;

pub use crate::exchange::PathInfo;

pub use ffi::ibv_wc as Wc;

fn errno(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn check(rc: i32, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        // Verbs return a positive errno (or -1 with errno set).
        let code = if rc > 0 {
            rc
        } else {
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        };
        let e = io::Error::from_raw_os_error(code);
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

/// Names of the RDMA devices of this host, through the `ibverbs` crate's
/// safe layer. No device (no RDMA driver loaded: `ENOSYS`, or an empty
/// list) is an empty list, not an error.
pub fn device_names() -> io::Result<Vec<String>> {
    match ibverbs::devices() {
        Ok(list) => Ok(list
            .iter()
            .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
            .collect()),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::ENOENT) | Some(libc::ENODEV) | Some(0) | None => {
                Ok(Vec::new())
            }
            _ => Err(io::Error::new(
                e.kind(),
                format!("ibv_get_device_list: {e}"),
            )),
        },
    }
}

/// An opened device.
pub struct Context {
    ctx: *mut ffi::ibv_context,
    pub name: String,
}

// SAFETY: libibverbs contexts are thread-safe.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// Open the device called `name`.
    pub fn open(name: &str) -> io::Result<Context> {
        let mut n = 0i32;
        // SAFETY: as in `device_names`.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(errno("ibv_get_device_list"));
        }
        let mut ctx = ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: valid device pointer, NUL-terminated name.
            let dn = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) };
            if dn.to_bytes() == name.as_bytes() {
                // SAFETY: valid device; the context outlives the list.
                ctx = unsafe { ffi::ibv_open_device(dev) };
                if ctx.is_null() {
                    let e = errno(&format!("ibv_open_device({name})"));
                    // SAFETY: freed once.
                    unsafe { ffi::ibv_free_device_list(list) };
                    return Err(e);
                }
                break;
            }
        }
        // SAFETY: freed once; opened contexts stay valid.
        unsafe { ffi::ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no RDMA device named {name:?}"),
            ));
        }
        Ok(Context {
            ctx,
            name: name.to_string(),
        })
    }

    /// Attributes of `port` (1-based).
    pub fn port(&self, port: u8) -> io::Result<ffi::ibv_port_attr> {
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: valid context; `attr` is a properly sized out-parameter.
        let rc = unsafe { ffi::ibv_query_port(self.ctx, port, &mut attr as *mut _ as *mut _) };
        check(rc, "ibv_query_port")?;
        Ok(attr)
    }

    fn device_attr(&self) -> io::Result<ffi::ibv_device_attr> {
        let mut attr = ffi::ibv_device_attr::default();
        // SAFETY: valid context and out-parameter.
        check(
            unsafe { ffi::ibv_query_device(self.ctx, &mut attr) },
            "ibv_query_device",
        )?;
        Ok(attr)
    }

    /// Number of physical ports.
    pub fn port_count(&self) -> io::Result<u8> {
        Ok(self.device_attr()?.phys_port_cnt)
    }

    /// How many RDMA READs a queue pair may have outstanding, as initiator
    /// and as responder (the smaller of the device's two limits).
    pub fn reads_in_flight(&self) -> io::Result<u8> {
        let a = self.device_attr()?;
        Ok(a.max_qp_rd_atom.min(a.max_qp_init_rd_atom).clamp(1, 255) as u8)
    }

    /// GID `index` of `port`.
    pub fn gid(&self, port: u8, index: u32) -> io::Result<[u8; 16]> {
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: valid context and out-parameter.
        let rc = unsafe { ffi::ibv_query_gid(self.ctx, port, index as i32, &mut gid) };
        check(rc, "ibv_query_gid")?;
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(unsafe { gid.raw })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened once, closed once, after every child object (they
        // hold an Arc to this context).
        unsafe { ffi::ibv_close_device(self.ctx) };
    }
}

/// A protection domain.
pub struct Pd {
    pd: *mut ffi::ibv_pd,
    pub ctx: Arc<Context>,
}

// SAFETY: protection domains may be used from any thread.
unsafe impl Send for Pd {}
unsafe impl Sync for Pd {}

impl Pd {
    pub fn new(ctx: Arc<Context>) -> io::Result<Arc<Pd>> {
        // SAFETY: valid context.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.ctx) };
        if pd.is_null() {
            return Err(errno("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd { pd, ctx }))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated once; every MR and QP holds an Arc to it.
        unsafe { ffi::ibv_dealloc_pd(self.pd) };
    }
}

/// A registered memory region. Registration pins the pages; the memory
/// must stay allocated until the region is dropped (the owner's duty).
pub struct Mr {
    mr: *mut ffi::ibv_mr,
    _pd: Arc<Pd>,
}

// SAFETY: an MR handle is an immutable key once registered.
unsafe impl Send for Mr {}
unsafe impl Sync for Mr {}

impl Mr {
    /// Register `len` bytes at `addr` for local use and remote writes
    /// (and, with `remote_read`, for peers' RDMA READs: memory exported
    /// for direct access).
    ///
    /// # Safety
    /// The memory must stay allocated while the region exists and while any
    /// work request referring to it is outstanding.
    pub unsafe fn register(
        pd: &Arc<Pd>,
        addr: *mut u8,
        len: usize,
        remote_read: bool,
    ) -> io::Result<Mr> {
        let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        if remote_read {
            access |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        }
        let mr = ffi::ibv_reg_mr(pd.pd, addr as *mut _, len, access.0 as i32);
        if mr.is_null() {
            return Err(errno(&format!("ibv_reg_mr({len} bytes)")));
        }
        Ok(Mr {
            mr,
            _pd: pd.clone(),
        })
    }
    pub fn lkey(&self) -> u32 {
        // SAFETY: valid MR.
        unsafe { (*self.mr).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: valid MR.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once.
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

/// A completion queue with its own completion channel, so a waiter can
/// sleep in `poll(2)` on [`Cq::fd`].
pub struct Cq {
    cq: *mut ffi::ibv_cq,
    channel: *mut ffi::ibv_comp_channel,
    unacked: u32,
    _ctx: Arc<Context>,
}

// SAFETY: used by one thread at a time (the link's owner).
unsafe impl Send for Cq {}

impl Cq {
    pub fn new(ctx: &Arc<Context>, entries: i32) -> io::Result<Cq> {
        // SAFETY: valid context.
        let channel = unsafe { ffi::ibv_create_comp_channel(ctx.ctx) };
        if channel.is_null() {
            return Err(errno("ibv_create_comp_channel"));
        }
        // SAFETY: valid context and channel.
        let cq = unsafe { ffi::ibv_create_cq(ctx.ctx, entries, ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = errno("ibv_create_cq");
            // SAFETY: created above, unused.
            unsafe { ffi::ibv_destroy_comp_channel(channel) };
            return Err(e);
        }
        let cq = Cq {
            cq,
            channel,
            unacked: 0,
            _ctx: ctx.clone(),
        };
        // The channel fd is polled, never blocked on.
        // SAFETY: fcntl on a valid fd.
        unsafe {
            let fd = cq.fd();
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(cq)
    }

    /// The completion channel's fd: readable after an armed completion.
    pub fn fd(&self) -> RawFd {
        // SAFETY: valid channel.
        unsafe { (*self.channel).fd }
    }

    /// Poll up to `wc.len()` completions; returns how many were filled.
    pub fn poll(&mut self, wc: &mut [Wc]) -> io::Result<usize> {
        // SAFETY: valid CQ; poll_cq is always provided by the driver; `wc`
        // has room for `len` entries.
        let n = unsafe {
            let ops = &(*(*self.cq).context).ops;
            ops.poll_cq.unwrap()(self.cq, wc.len() as i32, wc.as_mut_ptr())
        };
        if n < 0 {
            return Err(io::Error::other("ibv_poll_cq failed"));
        }
        Ok(n as usize)
    }

    /// Consume pending channel events (non-blocking), then ask for an event
    /// at the next completion.
    pub fn arm(&mut self) -> io::Result<()> {
        loop {
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            // SAFETY: valid channel; non-blocking fd, so this returns at once.
            let rc = unsafe { ffi::ibv_get_cq_event(self.channel, &mut cq, &mut ctx) };
            if rc != 0 {
                break;
            }
            self.unacked += 1;
        }
        if self.unacked >= 64 {
            // SAFETY: acknowledges events received above.
            unsafe { ffi::ibv_ack_cq_events(self.cq, self.unacked) };
            self.unacked = 0;
        }
        // SAFETY: valid CQ; req_notify_cq is always provided.
        let rc = unsafe {
            let ops = &(*(*self.cq).context).ops;
            ops.req_notify_cq.unwrap()(self.cq, 0)
        };
        check(rc, "ibv_req_notify_cq")
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every event received is acknowledged before the CQ is
        // destroyed (required by libibverbs); the QP using it is gone first
        // (the link drops its QP before its CQ).
        unsafe {
            if self.unacked > 0 {
                ffi::ibv_ack_cq_events(self.cq, self.unacked);
            }
            ffi::ibv_destroy_cq(self.cq);
            ffi::ibv_destroy_comp_channel(self.channel);
        }
    }
}

/// Settings for bringing a QP up.
#[derive(Clone, Copy, Debug)]
pub struct QpSettings {
    pub port: u8,
    /// GID index for a routed (RoCE or global IB) path; None = LID only.
    pub gid_index: Option<u8>,
    pub mtu: ffi::ibv_mtu,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout.
    pub timeout: u8,
    pub retry_cnt: u8,
    pub traffic_class: u8,
    /// RDMA READs outstanding per queue pair, each way.
    pub reads_in_flight: u8,
}

/// Local memory a work request reads: address, length, region key.
#[derive(Clone, Copy, Debug)]
pub struct Local {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// A reliable-connected queue pair.
pub struct Qp {
    qp: *mut ffi::ibv_qp,
    _pd: Arc<Pd>,
}

// SAFETY: used by one thread at a time (the link's owner).
unsafe impl Send for Qp {}

impl Qp {
    pub fn new(pd: &Arc<Pd>, cq: &Cq, send_wr: u32, recv_wr: u32) -> io::Result<Qp> {
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.cq,
            recv_cq: cq.cq,
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: valid PD and CQ; `init` is fully initialised.
        let qp = unsafe { ffi::ibv_create_qp(pd.pd, &mut init) };
        if qp.is_null() {
            return Err(errno("ibv_create_qp"));
        }
        Ok(Qp {
            qp,
            _pd: pd.clone(),
        })
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: valid QP.
        unsafe { (*self.qp).qp_num }
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        what: &str,
    ) -> io::Result<()> {
        // SAFETY: valid QP; `attr` holds every field `mask` names.
        check(
            unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) },
            what,
        )
    }

    /// RESET → INIT → RTR → RTS towards `remote`.
    pub fn connect(&self, s: &QpSettings, local_psn: u32, remote: &PathInfo) -> io::Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: s.port,
            // Remote reads reach only memory registered for them (direct
            // access); the queue pair itself allows them.
            qp_access_flags: (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
                .0,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )?;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: s.mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: s.reads_in_flight,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.port_num = s.port;
        if let Some(idx) = s.gid_index {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = remote.gid;
            a.ah_attr.grh.sgid_index = idx;
            a.ah_attr.grh.hop_limit = 255;
            a.ah_attr.grh.traffic_class = s.traffic_class;
        }
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
        )?;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: local_psn,
            timeout: s.timeout,
            retry_cnt: s.retry_cnt,
            // Receives are always posted ahead of the credits that allow a
            // write, so "receiver not ready" never happens in a correct
            // peer; retry it forever (7) rather than fail spuriously.
            rnr_retry: 7,
            max_rd_atomic: s.reads_in_flight,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
        )
    }

    /// Move to the error state: outstanding work requests are flushed and
    /// the peer's next transfers fail (used on close and abort).
    pub fn to_error(&self) {
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_ERR,
            ..Default::default()
        };
        let _ = self.modify(
            &mut a,
            ffi::ibv_qp_attr_mask::IBV_QP_STATE,
            "ibv_modify_qp(ERR)",
        );
    }

    /// Post a receive with no scatter entries (it only absorbs an
    /// immediate: RDMA WRITE WITH IMMEDIATE data goes to the written address).
    pub fn post_recv(&mut self, wr_id: u64) -> io::Result<()> {
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: valid QP; the WR is read during the call only.
        let rc = unsafe {
            let ops = &(*(*self.qp).context).ops;
            ops.post_recv.unwrap()(self.qp, &mut wr, &mut bad)
        };
        check(rc, "ibv_post_recv")
    }

    /// Post a signaled RDMA WRITE WITH IMMEDIATE of `local` to `remote`
    /// (key `rkey`).
    ///
    /// # Safety
    /// `local` must lie in the region of its key and stay valid and
    /// unmodified until the work request completes.
    pub unsafe fn post_write_imm(
        &mut self,
        wr_id: u64,
        local: Local,
        remote: u64,
        rkey: u32,
        imm: u32,
    ) -> io::Result<()> {
        let op = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        let what = "ibv_post_send(RDMA_WRITE_WITH_IMM)";
        self.post_rdma(wr_id, op, local, (remote, rkey), Some(imm), what)
    }

    /// Post a signaled RDMA READ of `local.len` bytes at `remote` (key
    /// `rkey`) into `local`.
    ///
    /// # Safety
    /// `local` must lie in the region of its key and stay valid, and be
    /// neither read nor written, until the work request completes.
    pub unsafe fn post_read(
        &mut self,
        wr_id: u64,
        local: Local,
        remote: u64,
        rkey: u32,
    ) -> io::Result<()> {
        let op = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
        self.post_rdma(
            wr_id,
            op,
            local,
            (remote, rkey),
            None,
            "ibv_post_send(RDMA_READ)",
        )
    }

    /// One signaled RDMA operation between `local` and the peer's
    /// `(address, rkey)`; the callers' safety contracts apply.
    unsafe fn post_rdma(
        &mut self,
        wr_id: u64,
        opcode: ffi::ibv_wr_opcode::Type,
        local: Local,
        (remote, rkey): (u64, u32),
        imm: Option<u32>,
        what: &'static str,
    ) -> io::Result<()> {
        let mut sge = ffi::ibv_sge {
            addr: local.addr,
            length: local.len,
            lkey: local.lkey,
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        if let Some(imm) = imm {
            wr.__bindgen_anon_1.imm_data = imm.to_be();
        }
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = rkey;
        self.post_send(&mut wr, what)
    }

    /// Post a signaled zero-length SEND WITH IMMEDIATE (a credit message).
    pub fn post_send_imm(&mut self, wr_id: u64, imm: u32) -> io::Result<()> {
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            sg_list: ptr::null_mut(),
            num_sge: 0,
            opcode: ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.__bindgen_anon_1.imm_data = imm.to_be();
        // SAFETY: no memory is referenced.
        unsafe { self.post_send(&mut wr, "ibv_post_send(SEND_WITH_IMM)") }
    }

    unsafe fn post_send(&mut self, wr: &mut ffi::ibv_send_wr, what: &str) -> io::Result<()> {
        let mut bad = ptr::null_mut();
        let ops = &(*(*self.qp).context).ops;
        check(ops.post_send.unwrap()(self.qp, wr, &mut bad), what)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once, before its CQ (field order
        // of the link) and PD (Arc).
        unsafe { ffi::ibv_destroy_qp(self.qp) };
    }
}

/// A work completion's status in words (`ibv_wc_status_str`).
pub fn status_str(status: u32) -> String {
    // SAFETY: returns a static string for any value.
    unsafe { CStr::from_ptr(ffi::ibv_wc_status_str(status)) }
        .to_string_lossy()
        .into_owned()
}
