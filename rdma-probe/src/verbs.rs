//! RAII wrappers over the librdmacm / libibverbs objects the probes use.
//!
//! Each object keeps an `Arc` of the object it was created from, so a parent
//! can never be freed before its children, whatever order the owner drops them
//! in: event channel ← cm_id ← PD / completion channel ← CQ ← QP, PD ← MR.
//! The cm_id outlives every verbs object made on its `verbs` context, because
//! librdmacm may close a device context when its last cm_id is destroyed
//! (`ucma_put_device` in librdmacm/cma.c).
//!
//! Thread safety: libibverbs and librdmacm calls are thread-safe (see
//! ibv_post_send(3), rdma_cm(7)); the wrappers add no Rust-side state that is
//! not behind `&self` of those calls, so they are `Send + Sync`.

use std::ffi::CStr;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys::*;

use qpwatch_common::vocab::{CmEventKind, QpState};

use crate::error::{Errno, Error};

/// Marks a raw-pointer wrapper as shareable across threads.
macro_rules! thread_safe {
    ($($t:ty),*) => {$(
        // SAFETY: the wrapped object is only used through libibverbs/librdmacm
        // calls, which are thread-safe; the wrapper owns it exclusively.
        unsafe impl Send for $t {}
        // SAFETY: as above; `&self` methods only call thread-safe verbs.
        unsafe impl Sync for $t {}
    )*};
}

thread_safe!(
    EventChannel,
    CmId,
    ProtectionDomain,
    CompletionChannel,
    CompletionQueue,
    QueuePair,
    CmQueuePair,
    MemoryRegion,
    AddressHandle
);

fn set_nonblocking(fd: RawFd) -> Result<(), Error> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(Error::os("fcntl(F_GETFL)"));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Error::os("fcntl(F_SETFL, O_NONBLOCK)"));
    }
    Ok(())
}

/// `poll(2)` over `fds`; 0 on timeout or EINTR (callers re-check their deadlines).
pub(crate) fn poll_fds(fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<usize, Error> {
    // SAFETY: `fds` is a valid, writable slice of pollfd of the given length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        if Errno::last().0 == libc::EINTR {
            return Ok(0);
        }
        return Err(Error::os("poll"));
    }
    Ok(n as usize)
}

pub(crate) fn pollin(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// An eventfd used to wake a poll loop from another thread.
pub(crate) struct EventFd {
    fd: RawFd,
}

impl EventFd {
    pub fn new() -> Result<EventFd, Error> {
        // SAFETY: eventfd takes no pointers; the new descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::os("eventfd"));
        }
        Ok(EventFd { fd })
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Resets the counter so the descriptor stops polling readable.
    pub fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd;
        // EAGAIN (nothing signalled) leaves `value` untouched.
        unsafe { libc::read(self.fd, (&mut value as *mut u64).cast(), 8) };
    }

    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd; a full counter
        // (EAGAIN) still leaves it readable, which is all the reader checks.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: closes the descriptor this struct owns, once.
        unsafe { libc::close(self.fd) };
    }
}

/// One rdma_cm event, copied out and already acknowledged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CmEvent {
    pub kind: CmEventKind,
    pub status: i32,
    /// The cm_id the event is for; for CONNECT_REQUEST a new child id the
    /// receiver owns and must adopt ([`CmId::adopt`]).
    pub id: *mut rdma_cm_id,
    /// The QP number the peer sent (CONNECT_REQUEST / CONNECT_RESPONSE).
    pub peer_qp_num: u32,
    /// RDMA_PS_UDP ids, ESTABLISHED (the SIDR REP): the route to the peer's
    /// UD QP. Meaningless for other events.
    pub ud: UdParam,
}

/// `struct rdma_ud_param` without its private data (gone after the ack).
#[derive(Clone, Copy)]
pub(crate) struct UdParam {
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

impl std::fmt::Debug for UdParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdParam")
            .field("qp_num", &self.qp_num)
            .field("qkey", &self.qkey)
            .finish_non_exhaustive()
    }
}

/// `struct rdma_event_channel`, with a non-blocking descriptor.
pub(crate) struct EventChannel {
    raw: NonNull<rdma_event_channel>,
}

impl EventChannel {
    pub fn new() -> Result<Arc<EventChannel>, Error> {
        // SAFETY: no arguments; returns NULL with errno set on failure.
        let raw = unsafe { rdma_create_event_channel() };
        let channel = EventChannel {
            raw: NonNull::new(raw).ok_or_else(|| Error::cm("rdma_create_event_channel"))?,
        };
        set_nonblocking(channel.fd())?;
        Ok(Arc::new(channel))
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: `raw` is a live event channel until drop.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Waits up to `timeout_ms` (0: just check) for the next event.
    pub fn next_event(&self, timeout_ms: i32) -> Result<Option<CmEvent>, Error> {
        if let Some(event) = self.try_event()? {
            return Ok(Some(event));
        }
        if timeout_ms == 0 {
            return Ok(None);
        }
        let mut fds = [pollin(self.fd())];
        if poll_fds(&mut fds, timeout_ms)? == 0 {
            return Ok(None);
        }
        self.try_event()
    }

    fn try_event(&self) -> Result<Option<CmEvent>, Error> {
        let mut event: *mut rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is live and its fd non-blocking; `event` is a
        // valid out-pointer.
        if unsafe { rdma_get_cm_event(self.raw.as_ptr(), &mut event) } != 0 {
            let errno = Errno::last();
            if errno.0 == libc::EAGAIN || errno.0 == libc::EINTR {
                return Ok(None);
            }
            return Err(Error::Cm {
                call: "rdma_get_cm_event",
                errno,
            });
        }
        // SAFETY: rdma_get_cm_event succeeded, so `event` points to a valid
        // event until it is acknowledged below; `param.conn` is the member the
        // connection events fill in.
        let copy = unsafe {
            let e = &*event;
            CmEvent {
                kind: CmEventKind::from_raw(e.event),
                status: e.status,
                id: e.id,
                peer_qp_num: e.param.conn.qp_num,
                ud: UdParam {
                    ah_attr: e.param.ud.ah_attr,
                    qp_num: e.param.ud.qp_num,
                    qkey: e.param.ud.qkey,
                },
            }
        };
        // Acknowledge at once: rdma_destroy_id blocks until every event
        // reported for the id has been acked (librdmacm/cma.c, rdma_destroy_id).
        // SAFETY: `event` came from rdma_get_cm_event and is acked exactly once.
        unsafe { rdma_ack_cm_event(event) };
        Ok(Some(copy))
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every cm_id on this channel holds an Arc of it, so none is left.
        unsafe { rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

fn sockaddr_from(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { MaybeUninit::zeroed().assume_init() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    storage
}

/// # Safety
/// `sa` must point to a readable sockaddr of the size its family implies.
unsafe fn socket_addr_of(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    match (*sa).sa_family as i32 {
        libc::AF_INET => {
            let sin = &*(sa as *const libc::sockaddr_in);
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            let sin6 = &*(sa as *const libc::sockaddr_in6);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn cm_rc(call: &'static str, rc: i32) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::cm(call))
    }
}

/// `struct rdma_cm_id` on the RDMA_PS_TCP port space (RC connections).
pub(crate) struct CmId {
    raw: NonNull<rdma_cm_id>,
    _channel: Arc<EventChannel>,
}

impl CmId {
    pub fn create(channel: &Arc<EventChannel>) -> Result<Arc<CmId>, Error> {
        Self::create_in(channel, rdma_port_space::RDMA_PS_TCP)
    }

    /// An id on the RDMA_PS_UDP port space (SIDR, UD QPs).
    pub fn create_udp(channel: &Arc<EventChannel>) -> Result<Arc<CmId>, Error> {
        Self::create_in(channel, rdma_port_space::RDMA_PS_UDP)
    }

    fn create_in(
        channel: &Arc<EventChannel>,
        space: rdma_port_space::Type,
    ) -> Result<Arc<CmId>, Error> {
        let mut raw: *mut rdma_cm_id = ptr::null_mut();
        // SAFETY: live channel, valid out-pointer, NULL context.
        let rc = unsafe { rdma_create_id(channel.raw.as_ptr(), &mut raw, ptr::null_mut(), space) };
        cm_rc("rdma_create_id", rc)?;
        Ok(Arc::new(CmId {
            raw: NonNull::new(raw).ok_or_else(|| Error::cm("rdma_create_id"))?,
            _channel: channel.clone(),
        }))
    }

    /// Takes ownership of the child id of a CONNECT_REQUEST event.
    ///
    /// # Safety
    /// `raw` must be the `id` of a CONNECT_REQUEST event received on
    /// `channel` and not yet destroyed or adopted.
    pub unsafe fn adopt(raw: *mut rdma_cm_id, channel: &Arc<EventChannel>) -> Option<Arc<CmId>> {
        Some(Arc::new(CmId {
            raw: NonNull::new(raw)?,
            _channel: channel.clone(),
        }))
    }

    pub fn raw(&self) -> *mut rdma_cm_id {
        self.raw.as_ptr()
    }

    pub fn resolve_addr(
        &self,
        source: Option<SocketAddr>,
        destination: SocketAddr,
        timeout_ms: i32,
    ) -> Result<(), Error> {
        let mut src = source.map(|s| sockaddr_from(&s));
        let mut dst = sockaddr_from(&destination);
        let src_ptr = src.as_mut().map_or(ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        // SAFETY: live id; the sockaddrs live on this stack frame for the call
        // (librdmacm copies them).
        let rc = unsafe {
            rdma_resolve_addr(
                self.raw(),
                src_ptr,
                (&mut dst as *mut libc::sockaddr_storage).cast(),
                timeout_ms,
            )
        };
        cm_rc("rdma_resolve_addr", rc)
    }

    pub fn resolve_route(&self, timeout_ms: i32) -> Result<(), Error> {
        // SAFETY: live id.
        cm_rc("rdma_resolve_route", unsafe {
            rdma_resolve_route(self.raw(), timeout_ms)
        })
    }

    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), Error> {
        let mut sa = sockaddr_from(&addr);
        // SAFETY: live id; `sa` lives for the call.
        let rc =
            unsafe { rdma_bind_addr(self.raw(), (&mut sa as *mut libc::sockaddr_storage).cast()) };
        cm_rc("rdma_bind_addr", rc)
    }

    pub fn listen(&self, backlog: i32) -> Result<(), Error> {
        // SAFETY: live, bound id.
        cm_rc("rdma_listen", unsafe { rdma_listen(self.raw(), backlog) })
    }

    /// The device context the id is bound to (after address resolution).
    pub fn verbs(&self) -> Result<NonNull<ibv_context>, Error> {
        // SAFETY: live id; `verbs` is set by librdmacm once bound to a device.
        NonNull::new(unsafe { (*self.raw()).verbs }).ok_or(Error::Cm {
            call: "rdma_cm_id.verbs",
            errno: Errno(libc::ENODEV),
        })
    }

    pub fn device_name(&self) -> Option<String> {
        let verbs = self.verbs().ok()?;
        // SAFETY: a bound context has a valid device whose name is a
        // NUL-terminated string owned by libibverbs.
        unsafe {
            let name = ibv_get_device_name((*verbs.as_ptr()).device);
            (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
        }
    }

    pub fn port_num(&self) -> u8 {
        // SAFETY: live id.
        unsafe { (*self.raw()).port_num }
    }

    /// The core clock (kHz) of the bound device if it stamps completions
    /// (`ibv_query_device_ex`: a completion timestamp mask and a core clock),
    /// `None` if it does not.
    pub fn completion_clock_khz(&self) -> Result<Option<u64>, Error> {
        let verbs = self.verbs()?;
        // SAFETY: ibv_device_attr_ex is plain old data; all-zero is valid
        // (and what a provider without query_device_ex leaves in the
        // extended fields).
        let mut attr: ibv_device_attr_ex = unsafe { MaybeUninit::zeroed().assume_init() };
        // SAFETY: the context is live while the id is; no input, `attr`
        // lives for the call.
        let rc = unsafe { ibv_query_device_ex(verbs.as_ptr(), ptr::null(), &mut attr) };
        if rc != 0 {
            return Err(Error::verbs_rc("ibv_query_device_ex", rc));
        }
        let stamps = attr.completion_timestamp_mask != 0 && attr.hca_core_clock != 0;
        Ok(stamps.then_some(attr.hca_core_clock))
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id; the source address is a sockaddr_storage inside it.
        unsafe { socket_addr_of(rdma_get_local_addr(&*self.raw())) }
    }

    /// The peer's address (of a connect request: the requester's source).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id; the destination address is a sockaddr_storage inside it.
        unsafe { socket_addr_of(rdma_get_peer_addr(&*self.raw())) }
    }

    /// The attributes and mask for moving a QP of this connection to `state`.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(ibv_qp_attr, i32), Error> {
        // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.qp_state = state.to_kernel();
        let mut mask = 0;
        // SAFETY: live id, valid out-pointers.
        let rc = unsafe { rdma_init_qp_attr(self.raw(), &mut attr, &mut mask) };
        cm_rc("rdma_init_qp_attr", rc)?;
        Ok((attr, mask))
    }

    pub fn connect(&self, param: &mut rdma_conn_param) -> Result<(), Error> {
        // SAFETY: live id with a resolved route; `param` lives for the call.
        cm_rc("rdma_connect", unsafe { rdma_connect(self.raw(), param) })
    }

    pub fn accept(&self, param: &mut rdma_conn_param) -> Result<(), Error> {
        // SAFETY: live child id of a connect request; `param` lives for the call.
        cm_rc("rdma_accept", unsafe { rdma_accept(self.raw(), param) })
    }

    pub fn reject(&self) -> Result<(), Error> {
        // SAFETY: live child id; no private data.
        cm_rc("rdma_reject", unsafe {
            rdma_reject(self.raw(), ptr::null(), 0)
        })
    }

    pub fn establish(&self) -> Result<(), Error> {
        // SAFETY: live id that received CONNECT_RESPONSE.
        cm_rc("rdma_establish", unsafe { rdma_establish(self.raw()) })
    }

    pub fn disconnect(&self) -> Result<(), Error> {
        // SAFETY: live id.
        cm_rc("rdma_disconnect", unsafe { rdma_disconnect(self.raw()) })
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: every verbs object made on this id's context holds an Arc of
        // it, so none is left; all its events were acked when received.
        unsafe { rdma_destroy_id(self.raw()) };
    }
}

/// `struct ibv_pd`.
pub(crate) struct ProtectionDomain {
    raw: NonNull<ibv_pd>,
    _id: Arc<CmId>,
}

impl ProtectionDomain {
    pub fn alloc(id: &Arc<CmId>) -> Result<Arc<ProtectionDomain>, Error> {
        let verbs = id.verbs()?;
        // SAFETY: the context is live while `id` is.
        let raw = unsafe { ibv_alloc_pd(verbs.as_ptr()) };
        Ok(Arc::new(ProtectionDomain {
            raw: NonNull::new(raw).ok_or_else(|| Error::verbs("ibv_alloc_pd"))?,
            _id: id.clone(),
        }))
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: QPs and MRs on this PD hold an Arc of it, so none is left.
        unsafe { ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}

/// `struct ibv_comp_channel`, with a non-blocking descriptor.
pub(crate) struct CompletionChannel {
    raw: NonNull<ibv_comp_channel>,
    _id: Arc<CmId>,
}

impl CompletionChannel {
    pub fn create(id: &Arc<CmId>) -> Result<Arc<CompletionChannel>, Error> {
        let verbs = id.verbs()?;
        // SAFETY: the context is live while `id` is.
        let raw = unsafe { ibv_create_comp_channel(verbs.as_ptr()) };
        let channel = CompletionChannel {
            raw: NonNull::new(raw).ok_or_else(|| Error::verbs("ibv_create_comp_channel"))?,
            _id: id.clone(),
        };
        set_nonblocking(channel.fd())?;
        Ok(Arc::new(channel))
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: live channel.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Takes one pending completion event, if any, for `cq` and acks it.
    pub fn take_event(&self, cq: &CompletionQueue) -> Result<bool, Error> {
        let mut ev_cq: *mut ibv_cq = ptr::null_mut();
        let mut ev_ctx: *mut libc::c_void = ptr::null_mut();
        // SAFETY: live channel with a non-blocking fd; valid out-pointers.
        if unsafe { ibv_get_cq_event(self.raw.as_ptr(), &mut ev_cq, &mut ev_ctx) } != 0 {
            let errno = Errno::last();
            if errno.0 == libc::EAGAIN {
                return Ok(false);
            }
            return Err(Error::Verbs {
                call: "ibv_get_cq_event",
                errno,
            });
        }
        // Ack at once: ibv_destroy_cq waits for every event to be acked.
        // SAFETY: the event is for a CQ on this channel, live while `cq` is.
        unsafe { ibv_ack_cq_events(ev_cq, 1) };
        debug_assert_eq!(ev_cq, cq.raw.as_ptr());
        Ok(true)
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: CQs on this channel hold an Arc of it, so none is left.
        unsafe { ibv_destroy_comp_channel(self.raw.as_ptr()) };
    }
}

/// A work completion, copied out of `struct ibv_wc`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Completion {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    pub vendor_err: u32,
}

impl Completion {
    pub fn is_success(&self) -> bool {
        self.status == ibv_wc_status::IBV_WC_SUCCESS
    }

    pub fn status_text(&self) -> String {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        unsafe { CStr::from_ptr(ibv_wc_status_str(self.status)) }
            .to_string_lossy()
            .into_owned()
    }
}

/// `struct ibv_cq` bound to a completion channel.
pub(crate) struct CompletionQueue {
    raw: NonNull<ibv_cq>,
    channel: Arc<CompletionChannel>,
}

impl CompletionQueue {
    pub fn create(
        channel: &Arc<CompletionChannel>,
        cqe: i32,
    ) -> Result<Arc<CompletionQueue>, Error> {
        // SAFETY: live channel; its context is live while the channel is.
        let raw = unsafe {
            let context = (*channel.raw.as_ptr()).context;
            ibv_create_cq(context, cqe, ptr::null_mut(), channel.raw.as_ptr(), 0)
        };
        Ok(Arc::new(CompletionQueue {
            raw: NonNull::new(raw).ok_or_else(|| Error::verbs("ibv_create_cq"))?,
            channel: channel.clone(),
        }))
    }

    pub fn channel(&self) -> &CompletionChannel {
        &self.channel
    }

    /// Asks for a completion event on the next completion.
    pub fn arm(&self) -> Result<(), Error> {
        // SAFETY: live CQ.
        let rc = unsafe { ibv_req_notify_cq(self.raw.as_ptr(), 0) };
        if rc != 0 {
            return Err(Error::verbs_rc("ibv_req_notify_cq", rc));
        }
        Ok(())
    }

    /// Polls up to `out.len()` raw work completions (UD receives need all of
    /// `struct ibv_wc` for ibv_create_ah_from_wc); returns how many.
    pub fn poll_wc(&self, out: &mut [ibv_wc]) -> Result<usize, Error> {
        let max = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: live CQ; `out` has room for `max` entries.
        let n = unsafe { ibv_poll_cq(self.raw.as_ptr(), max, out.as_mut_ptr()) };
        if n < 0 {
            return Err(Error::verbs_rc("ibv_poll_cq", -n));
        }
        Ok(n as usize)
    }

    /// Polls up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize, Error> {
        const BATCH: usize = 16;
        // SAFETY: ibv_wc is plain old data; all-zero is valid.
        let mut wcs: [ibv_wc; BATCH] = unsafe { MaybeUninit::zeroed().assume_init() };
        let max = out.len().min(BATCH) as i32;
        // SAFETY: live CQ; `wcs` has room for `max` entries.
        let n = unsafe { ibv_poll_cq(self.raw.as_ptr(), max, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(Error::verbs_rc("ibv_poll_cq", -n));
        }
        for (slot, wc) in out.iter_mut().zip(&wcs[..n as usize]) {
            *slot = Completion {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                byte_len: wc.byte_len,
                vendor_err: wc.vendor_err,
            };
        }
        Ok(n as usize)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: QPs on this CQ hold an Arc of it; all events were acked.
        unsafe { ibv_destroy_cq(self.raw.as_ptr()) };
    }
}

/// A registered buffer: the memory is owned here and freed after ibv_dereg_mr.
pub(crate) struct MemoryRegion {
    mr: NonNull<ibv_mr>,
    buf: NonNull<u8>,
    len: usize,
    _pd: Arc<ProtectionDomain>,
}

impl MemoryRegion {
    pub fn register(pd: &Arc<ProtectionDomain>, len: usize) -> Result<MemoryRegion, Error> {
        let buf = NonNull::from(Box::leak(vec![0u8; len].into_boxed_slice())).cast::<u8>();
        // SAFETY: `buf` points to `len` bytes that stay allocated until the MR
        // is deregistered (Drop), or are freed below if registration fails.
        let mr = unsafe {
            ibv_reg_mr(
                pd.raw.as_ptr(),
                buf.as_ptr().cast(),
                len,
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32,
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            let err = Error::verbs("ibv_reg_mr");
            // SAFETY: `buf` came from the leaked Box above and is not registered.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(buf.as_ptr(), len)) });
            return Err(err);
        };
        Ok(MemoryRegion {
            mr,
            buf,
            len,
            _pd: pd.clone(),
        })
    }

    fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    fn sge(&self, offset: usize, len: usize) -> ibv_sge {
        assert!(
            offset + len <= self.len,
            "SGE outside the registered buffer"
        );
        ibv_sge {
            addr: self.buf.as_ptr() as u64 + offset as u64,
            length: len as u32,
            lkey: self.lkey(),
        }
    }

    /// Copies `data` into the buffer at `offset`. The caller makes sure no
    /// posted work request uses that range.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.len);
        // SAFETY: in bounds (checked); the device does not access the range.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), self.buf.as_ptr().add(offset), data.len())
        };
    }

    /// Copies bytes out of the buffer at `offset` (after their completion).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset + out.len() <= self.len);
        // SAFETY: in bounds (checked); the receive into the range has completed.
        unsafe {
            ptr::copy_nonoverlapping(self.buf.as_ptr().add(offset), out.as_mut_ptr(), out.len())
        };
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: deregister first, then free the memory the MR covered.
        unsafe {
            ibv_dereg_mr(self.mr.as_ptr());
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
                self.buf.as_ptr(),
                self.len,
            )));
        }
    }
}

/// `struct ibv_ah`: the route of UD sends to one peer.
pub(crate) struct AddressHandle {
    raw: NonNull<ibv_ah>,
    _pd: Arc<ProtectionDomain>,
}

impl AddressHandle {
    pub fn create(pd: &Arc<ProtectionDomain>, attr: &ibv_ah_attr) -> Result<AddressHandle, Error> {
        let mut attr = *attr;
        // SAFETY: live PD; `attr` lives for the call, which copies it.
        let raw = unsafe { ibv_create_ah(pd.raw.as_ptr(), &mut attr) };
        Ok(AddressHandle {
            raw: NonNull::new(raw).ok_or_else(|| Error::verbs("ibv_create_ah"))?,
            _pd: pd.clone(),
        })
    }

    /// The route back to the sender of a received UD message; `grh` is the
    /// 40 bytes at the start of the receive buffer.
    pub fn from_wc(
        pd: &Arc<ProtectionDomain>,
        wc: &mut ibv_wc,
        grh: &mut [u8; 40],
        port_num: u8,
    ) -> Result<AddressHandle, Error> {
        // SAFETY: live PD; `wc` is a completion polled from a CQ of this PD's
        // context and `grh` its 40 GRH bytes; both live for the call, which
        // only reads them.
        let raw = unsafe {
            ibv_create_ah_from_wc(
                pd.raw.as_ptr(),
                wc,
                grh.as_mut_ptr().cast::<ibv_grh>(),
                port_num,
            )
        };
        Ok(AddressHandle {
            raw: NonNull::new(raw).ok_or_else(|| Error::verbs("ibv_create_ah_from_wc"))?,
            _pd: pd.clone(),
        })
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: live AH, destroyed once. A send still queued with it may
        // complete in error (rxe looks user AHs up when it transmits); the
        // mesh drops AHs only for removed targets and a full answer cache.
        unsafe { ibv_destroy_ah(self.raw.as_ptr()) };
    }
}

/// One signalled SEND work request (UD when `ud` gives its destination).
fn post_signalled_send(
    qp: *mut ibv_qp,
    wr_id: u64,
    mr: &MemoryRegion,
    offset: usize,
    len: usize,
    inline: bool,
    ud: Option<ud_t>,
) -> Result<(), Error> {
    let mut sge = mr.sge(offset, len);
    // SAFETY: ibv_send_wr is plain old data; all-zero is valid.
    let mut wr: ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
    wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
    if inline {
        wr.send_flags |= ibv_send_flags::IBV_SEND_INLINE.0;
    }
    if let Some(ud) = ud {
        wr.wr.ud = ud;
    }
    let mut bad: *mut ibv_send_wr = ptr::null_mut();
    // SAFETY: live QP (and AH, same PD); `wr` and `sge` live for the call,
    // which copies them (or, inline, the data); the buffer stays registered
    // while `mr` lives.
    let rc = unsafe { ibv_post_send(qp, &mut wr, &mut bad) };
    if rc != 0 {
        return Err(Error::verbs_rc("ibv_post_send", rc));
    }
    Ok(())
}

/// Posting work requests, shared by both kinds of QP.
pub(crate) trait PostQueue {
    fn raw_qp(&self) -> *mut ibv_qp;

    fn qp_num(&self) -> u32 {
        // SAFETY: `raw_qp` is live while `self` is.
        unsafe { (*self.raw_qp()).qp_num }
    }

    /// A signalled SEND of `len` bytes at `offset` of `mr`.
    fn post_send(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        inline: bool,
    ) -> Result<(), Error> {
        post_signalled_send(self.raw_qp(), wr_id, mr, offset, len, inline, None)
    }

    /// A signalled UD SEND of `len` bytes at `offset` of `mr` to `remote_qpn`
    /// through `ah`.
    #[allow(clippy::too_many_arguments)]
    fn post_send_ud(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        inline: bool,
        ah: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> Result<(), Error> {
        let ud = ud_t {
            ah: ah.raw.as_ptr(),
            remote_qpn,
            remote_qkey,
        };
        post_signalled_send(self.raw_qp(), wr_id, mr, offset, len, inline, Some(ud))
    }

    /// A receive of up to `len` bytes into `offset` of `mr`.
    fn post_recv(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<(), Error> {
        let mut sge = mr.sge(offset, len);
        let mut wr = ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: live QP; `wr` and `sge` live for the call, which copies them.
        let rc = unsafe { ibv_post_recv(self.raw_qp(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::verbs_rc("ibv_post_recv", rc));
        }
        Ok(())
    }
}

/// Send/receive queue sizes of a QP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpCaps {
    pub send_wr: u32,
    pub recv_wr: u32,
    pub inline_data: u32,
}

fn qp_init_attr(
    cq: &CompletionQueue,
    caps: QpCaps,
    qp_type: ibv_qp_type::Type,
) -> ibv_qp_init_attr {
    // SAFETY: ibv_qp_init_attr is plain old data; all-zero is valid.
    let mut attr: ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
    attr.send_cq = cq.raw.as_ptr();
    attr.recv_cq = cq.raw.as_ptr();
    attr.cap.max_send_wr = caps.send_wr;
    attr.cap.max_recv_wr = caps.recv_wr;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr.cap.max_inline_data = caps.inline_data;
    attr.qp_type = qp_type;
    attr
}

/// An RC QP created with ibv_create_qp, whose state changes its owner drives.
pub(crate) struct QueuePair {
    raw: NonNull<ibv_qp>,
    inline_data: u32,
    _pd: Arc<ProtectionDomain>,
    _cq: Arc<CompletionQueue>,
}

impl QueuePair {
    pub fn create(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<QueuePair, Error> {
        Self::create_typed(pd, cq, caps, ibv_qp_type::IBV_QPT_RC)
    }

    /// A UD QP (IBV_QPT_UD).
    pub fn create_ud(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<QueuePair, Error> {
        Self::create_typed(pd, cq, caps, ibv_qp_type::IBV_QPT_UD)
    }

    fn create_typed(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QpCaps,
        qp_type: ibv_qp_type::Type,
    ) -> Result<QueuePair, Error> {
        let mut attr = qp_init_attr(cq, caps, qp_type);
        // SAFETY: live PD and CQ (same context); `attr` lives for the call.
        let raw = unsafe { ibv_create_qp(pd.raw.as_ptr(), &mut attr) };
        Ok(QueuePair {
            raw: NonNull::new(raw).ok_or_else(|| Error::verbs("ibv_create_qp"))?,
            inline_data: attr.cap.max_inline_data,
            _pd: pd.clone(),
            _cq: cq.clone(),
        })
    }

    /// The inline size the provider granted.
    pub fn max_inline_data(&self) -> u32 {
        self.inline_data
    }

    /// ibv_modify_qp; returns 0 or the errno.
    pub fn modify(&self, attr: &mut ibv_qp_attr, mask: i32) -> i32 {
        // SAFETY: live QP; `attr` lives for the call.
        unsafe { ibv_modify_qp(self.raw.as_ptr(), attr, mask) }
    }

    /// ibv_destroy_qp; returns 0 or the errno. On failure the QP is left to
    /// the kernel's cleanup at process exit: nothing else can free it.
    pub fn destroy(self) -> i32 {
        let this = ManuallyDrop::new(self);
        // SAFETY: live QP, destroyed once; `ManuallyDrop` skips `Drop`, and the
        // Arcs are released right after.
        let rc = unsafe { ibv_destroy_qp(this.raw.as_ptr()) };
        // SAFETY: each Arc field is read out once and never used again.
        unsafe {
            drop(ptr::read(&this._cq));
            drop(ptr::read(&this._pd));
        }
        rc
    }
}

impl PostQueue for QueuePair {
    fn raw_qp(&self) -> *mut ibv_qp {
        self.raw.as_ptr()
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: live QP, destroyed once.
        unsafe { ibv_destroy_qp(self.raw.as_ptr()) };
    }
}

/// An RC QP created with rdma_create_qp: librdmacm drives its states.
pub(crate) struct CmQueuePair {
    id: Arc<CmId>,
    _pd: Arc<ProtectionDomain>,
    _cq: Arc<CompletionQueue>,
}

impl CmQueuePair {
    pub fn create(
        id: &Arc<CmId>,
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<CmQueuePair, Error> {
        let mut attr = qp_init_attr(cq, caps, ibv_qp_type::IBV_QPT_RC);
        // SAFETY: live id, PD and CQ on the id's context; `attr` lives for the call.
        let rc = unsafe { rdma_create_qp(id.raw(), pd.raw.as_ptr(), &mut attr) };
        cm_rc("rdma_create_qp", rc)?;
        Ok(CmQueuePair {
            id: id.clone(),
            _pd: pd.clone(),
            _cq: cq.clone(),
        })
    }
}

impl PostQueue for CmQueuePair {
    fn raw_qp(&self) -> *mut ibv_qp {
        // SAFETY: live id whose `qp` rdma_create_qp set.
        unsafe { (*self.id.raw()).qp }
    }
}

impl Drop for CmQueuePair {
    fn drop(&mut self) {
        // SAFETY: the QP was created on this id by rdma_create_qp; destroyed once.
        unsafe { rdma_destroy_qp(self.id.raw()) };
    }
}

/// Connection parameters of a probe connection: one outstanding RDMA read each
/// way, and 7 retries (for RNR, 7 means retry forever).
pub fn rc_conn_param(qp_num: u32) -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared vocabulary's numbering and names are libibverbs' and
    /// librdmacm's.
    #[test]
    fn vocabulary_matches_rdma_sys() {
        use ibv_qp_state as s;
        let states = [
            s::IBV_QPS_RESET,
            s::IBV_QPS_INIT,
            s::IBV_QPS_RTR,
            s::IBV_QPS_RTS,
            s::IBV_QPS_SQD,
            s::IBV_QPS_SQE,
            s::IBV_QPS_ERR,
        ];
        for (state, raw) in QpState::ALL.into_iter().zip(states) {
            assert_eq!(state.to_kernel(), raw, "{state}");
        }
        for kind in CmEventKind::KNOWN {
            // SAFETY: rdma_event_str returns a static string for any value.
            let name = unsafe { CStr::from_ptr(rdma_event_str(kind.raw())) };
            assert_eq!(name.to_str(), Ok(kind.name()));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!(CmEventKind::Other(99).to_string(), "RDMA_CM_EVENT 99");
    }
}
