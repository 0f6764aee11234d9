//! memfs patch: FUSE over io_uring (Linux 6.14+, with the `fuse` module's
//! `enable_uring` parameter on).
//!
//! Why: with `/dev/fuse`, every request wakes a worker thread that sleeps in
//! `read(2)`, usually on another CPU; on a virtual machine that wake-up (an
//! IPI to a halted vCPU) costs more than the file system's work. With
//! io_uring the kernel keeps one queue per CPU and hands a request from CPU
//! `c` to the thread serving queue `c`, which is pinned to CPU `c`: the
//! blocked caller and the server take turns on one CPU.
//!
//! Protocol (Documentation/filesystems/fuse-io-uring.rst): after FUSE_INIT
//! negotiated `FUSE_OVER_IO_URING`, each ring entry (a request header buffer
//! and a payload buffer) is handed to the kernel with
//! `FUSE_IO_URING_CMD_REGISTER`. The kernel completes that command when a
//! request is in the buffers; the reply is written into the same buffers and
//! handed back with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits
//! for the next request. FORGET, INTERRUPT and notifications still use
//! `/dev/fuse`, so the classic workers keep running beside the rings.
//!
//! Layout of a request: the kernel writes `fuse_in_header` into the first
//! 128 bytes of the header buffer, the operation's first argument into the
//! next 128, and every other argument into the payload. fuser parses one
//! contiguous message, so the header and first argument are copied right in
//! front of the payload (into headroom kept before it): the payload, which
//! holds a write's data, is never copied.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::ll;
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::FilesystemHolder;
use crate::session::SessionEventLoop;

/// `FUSE_URING_IN_OUT_HEADER_SZ` and `FUSE_URING_OP_IN_OUT_SZ`.
const IN_OUT_SZ: usize = 128;
const OP_IN_SZ: usize = 128;
const IN_HEADER_SZ: usize = size_of::<ll::fuse_abi::fuse_in_header>();
const OUT_HEADER_SZ: usize = size_of::<ll::fuse_abi::fuse_out_header>();
/// Room in front of the payload for the in-header and the first argument.
const HEADROOM: usize = IN_HEADER_SZ + OP_IN_SZ;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The user data of the eventfd poll that stops a ring thread.
const STOP: u64 = u64::MAX;
/// The user data of the eventfd poll by which another thread asks the ring
/// thread to submit a commit it queued.
const KICK: u64 = u64::MAX - 1;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct EntInOut {
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`, written by the kernel (request) and by us
/// (reply).
#[repr(C)]
struct ReqHeader {
    in_out: [u8; IN_OUT_SZ],
    op_in: [u8; OP_IN_SZ],
    ent_in_out: EntInOut,
}

/// Where a reply goes while its request is being dispatched.
enum ReplyMode {
    /// Straight into the ring buffers, then committed.
    Direct,
    /// The request's arguments live in the payload buffer and are still
    /// borrowed: the reply waits here until dispatch returns.
    Stage(Option<Vec<u8>>),
}

struct EntryState {
    commit_id: u64,
    mode: ReplyMode,
}

/// One ring entry: its buffers belong to the kernel between a register or
/// commit and the completion that hands a request back.
struct Entry {
    header: *mut ReqHeader,
    /// `HEADROOM` bytes, then the payload the kernel reads and writes.
    buf: *mut u8,
    qid: u16,
    state: Mutex<EntryState>,
    /// The header and payload iovecs the register command points at.
    iov: Box<[libc::iovec; 2]>,
}

// The buffers are never freed: after the session, a commit submitted by
// another thread may still be cancelled asynchronously by the kernel, which
// could write into them. A process serves one mount; the loss is bounded.
//
// SAFETY: the raw pointers are owned allocations, never freed. Who may
// touch them is decided by the protocol: the ring thread between a
// completion and dispatch, the reply sender (under `state`) until it commits,
// never two at once; the kernel only between a commit and a completion.
unsafe impl Send for Entry {}
// SAFETY: as above; shared access goes through `state`.
unsafe impl Sync for Entry {}

impl Entry {
    fn new(qid: u16, payload: usize) -> io::Result<Entry> {
        let header_layout = std::alloc::Layout::new::<ReqHeader>();
        let buf_layout = Self::buf_layout(payload);
        // SAFETY: both layouts have a non-zero size. Zeroed memory keeps the
        // untouched part of a large payload buffer unbacked (calloc maps it).
        let (header, buf) = unsafe {
            (
                std::alloc::alloc_zeroed(header_layout).cast::<ReqHeader>(),
                std::alloc::alloc_zeroed(buf_layout),
            )
        };
        if header.is_null() || buf.is_null() {
            // SAFETY: each pointer, when not null, came from the matching layout.
            unsafe {
                if !header.is_null() {
                    std::alloc::dealloc(header.cast(), header_layout);
                }
                if !buf.is_null() {
                    std::alloc::dealloc(buf, buf_layout);
                }
            }
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        let iov = Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: size_of::<ReqHeader>(),
            },
            libc::iovec {
                // SAFETY: `buf` spans HEADROOM + payload bytes.
                iov_base: unsafe { buf.add(HEADROOM) }.cast(),
                iov_len: payload,
            },
        ]);
        Ok(Entry {
            header,
            buf,
            qid,
            state: Mutex::new(EntryState {
                commit_id: 0,
                mode: ReplyMode::Direct,
            }),
            iov,
        })
    }

    fn buf_layout(payload: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(HEADROOM + payload, 4096).expect("payload size")
    }

    fn payload_cap(&self) -> usize {
        self.iov[1].iov_len
    }

    /// Writes a reply (out header first, then its arguments) into the ring
    /// buffers. A reply larger than the payload buffer becomes EIO.
    ///
    /// # Safety
    /// The caller owns the entry's buffers: the kernel handed them over and
    /// nobody borrows the payload.
    unsafe fn write_reply(&self, data: &[IoSlice<'_>]) {
        let total: usize = data.iter().map(|s| s.len()).sum();
        // SAFETY: per the contract the header is ours.
        let header = unsafe { &mut *self.header };
        let mut out = [0u8; OUT_HEADER_SZ];
        let mut pos = 0;
        // SAFETY: per the contract the payload is ours and not borrowed;
        // it spans `payload_cap` bytes after HEADROOM.
        let payload =
            unsafe { std::slice::from_raw_parts_mut(self.buf.add(HEADROOM), self.payload_cap()) };
        let fits = total >= OUT_HEADER_SZ && total - OUT_HEADER_SZ <= payload.len();
        if fits {
            for s in data {
                let mut s: &[u8] = s;
                if pos < OUT_HEADER_SZ {
                    let n = s.len().min(OUT_HEADER_SZ - pos);
                    out[pos..pos + n].copy_from_slice(&s[..n]);
                    pos += n;
                    s = &s[n..];
                }
                let at = pos - OUT_HEADER_SZ;
                payload[at..at + s.len()].copy_from_slice(s);
                pos += s.len();
            }
        } else {
            // Keep the unique id; answer EIO with no arguments.
            let mut head = [0u8; OUT_HEADER_SZ];
            let mut n = 0;
            for s in data {
                let k = s.len().min(OUT_HEADER_SZ - n);
                head[n..n + k].copy_from_slice(&s[..k]);
                n += k;
                if n == OUT_HEADER_SZ {
                    break;
                }
            }
            error!("io_uring reply of {total} bytes does not fit the ring buffer");
            out = head;
            out[0..4].copy_from_slice(&(OUT_HEADER_SZ as u32).to_ne_bytes());
            out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            pos = OUT_HEADER_SZ;
        }
        header.in_out[..OUT_HEADER_SZ].copy_from_slice(&out);
        header.ent_in_out.payload_sz = (pos - OUT_HEADER_SZ) as u32;
    }
}

/// One io_uring with its entries, served by one thread.
pub(crate) struct Ring {
    uring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Serializes pushes to the submission queue (replies from other threads).
    sq: Mutex<()>,
    entries: Vec<Entry>,
    dev: Channel,
    stop_fd: OwnedFd,
    /// Written by a thread that queued a commit (a reply sent later): the
    /// ring thread wakes and submits it itself. The task that submits a
    /// COMMIT_AND_FETCH is the one the kernel later runs that entry's
    /// task work on (copying the next request in); a thread that may block
    /// uninterruptibly (the page cache invalidator, waiting for a page lock
    /// that only that next request's reply releases) must never be it.
    kick_fd: OwnedFd,
    stopping: AtomicBool,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("entries", &self.entries.len())
            .finish()
    }
}

/// Sends one reply through a ring entry.
#[derive(Clone, Debug)]
pub(crate) struct UringSender {
    ring: Arc<Ring>,
    idx: u32,
}

impl UringSender {
    /// `/dev/fuse`, for the ioctls that still go there.
    pub(crate) fn dev(&self) -> crate::channel::ChannelSender {
        self.ring.dev.sender()
    }

    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let e = &self.ring.entries[self.idx as usize];
        let mut st = e.state.lock();
        if let ReplyMode::Stage(staged) = &mut st.mode {
            let mut v = Vec::with_capacity(data.iter().map(|s| s.len()).sum());
            for s in data {
                v.extend_from_slice(s);
            }
            *staged = Some(v);
            return Ok(());
        }
        // SAFETY: Direct mode: the request is no longer borrowing the payload
        // (or never did), and the kernel waits for our commit.
        unsafe { e.write_reply(data) };
        self.ring.commit(self.idx, st.commit_id)
    }
}

impl Ring {
    fn new(dev: Channel, qids: &[u16], depth: usize, payload: usize) -> io::Result<Ring> {
        let slots = qids.len() * depth;
        let uring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(2 * (slots as u32 + 1))
            .build(slots as u32 + 2)?;
        let mut entries = Vec::with_capacity(slots);
        for &q in qids {
            for _ in 0..depth {
                entries.push(Entry::new(q, payload)?);
            }
        }
        // SAFETY: eventfd(2) with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let stop_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: eventfd(2) with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let kick_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Ring {
            uring,
            sq: Mutex::new(()),
            entries,
            dev,
            stop_fd,
            kick_fd,
            stopping: AtomicBool::new(false),
        })
    }

    fn cmd(&self, idx: u32, op: u32, commit_id: u64) -> squeue::Entry128 {
        let e = &self.entries[idx as usize];
        // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 pad[6]; }
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&e.qid.to_ne_bytes());
        let mut b = opcode::UringCmd80::new(types::Fd(self.dev.as_fd().as_raw_fd()), op).cmd(cmd);
        if op == CMD_REGISTER {
            b = b.addr(Some(e.iov.as_ptr() as u64));
        }
        let sqe = b.build().user_data(u64::from(idx));
        if op != CMD_REGISTER {
            return sqe;
        }
        // The register command also carries the iovec count in `sqe->len`,
        // which the builder does not expose.
        // SAFETY: `Entry128` is `repr(C)` over the 128-byte `io_uring_sqe`
        // (plain integers); `len` is the u32 at offset 24.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: the same plain bytes back into the same type.
        unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
    }

    fn push(&self, sqe: &squeue::Entry128) -> io::Result<()> {
        let _g = self.sq.lock();
        // SAFETY: `sq` serializes every SubmissionQueue of this ring; the
        // SQE points at nothing or at an iovec array owned by the entry.
        unsafe {
            let mut sq = self.uring.submission_shared();
            sq.push(sqe)
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        Ok(())
    }

    /// Hands an entry back with its reply. The ring thread always submits
    /// it (with its next wait): another thread only queues it and kicks
    /// the ring thread awake (see `kick_fd` for why).
    fn commit(&self, idx: u32, commit_id: u64) -> io::Result<()> {
        self.push(&self.cmd(idx, CMD_COMMIT_AND_FETCH, commit_id))?;
        if !ON_RING.with(|r| std::ptr::eq(r.get(), self)) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writing 8 bytes to our eventfd.
            if unsafe { libc::write(self.kick_fd.as_raw_fd(), one.as_ptr().cast(), 8) } != 8 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    fn kick_poll(&self) -> io::Result<()> {
        let poll = opcode::PollAdd::new(types::Fd(self.kick_fd.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(KICK);
        self.push(&poll.into())
    }

    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe {
            libc::write(self.stop_fd.as_raw_fd(), one.as_ptr().cast(), 8);
        }
    }
}

thread_local! {
    /// The ring the current thread serves, if any: its replies are batched.
    static ON_RING: std::cell::Cell<*const Ring> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// The rings of a session and their threads.
#[derive(Debug)]
pub(crate) struct Rings {
    rings: Vec<Arc<Ring>>,
    threads: Vec<JoinHandle<()>>,
}

impl Rings {
    pub(crate) fn stop_and_join(self) {
        for r in &self.rings {
            r.stop();
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The number of queues the kernel keeps: one per possible CPU.
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
                .max()
        })
        .map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |m| m + 1,
        )
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays in bounds
    // for cpu < CPU_SETSIZE, which we check.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(
                "io_uring thread not pinned to CPU {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Starts one ring per thread, each serving every `threads`-th queue, and
/// registers their entries. Returns once every ring has registered (or
/// failed: then the error, and `/dev/fuse` keeps serving everything).
pub(crate) fn start<FS: Filesystem + 'static>(
    dev: &Channel,
    filesystem: Arc<FilesystemHolder<FS>>,
    allowed: crate::session::SessionACL,
    session_owner: nix::unistd::Uid,
    threads: usize,
    depth: usize,
    payload: usize,
) -> io::Result<Rings> {
    let queues = possible_cpus();
    let threads = threads.clamp(1, queues);
    let mut rings = Vec::with_capacity(threads);
    let mut handles = Vec::with_capacity(threads);
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<()>>();
    for t in 0..threads {
        let qids: Vec<u16> = (t..queues).step_by(threads).map(|q| q as u16).collect();
        let ring = Arc::new(Ring::new(dev.clone(), &qids, depth, payload)?);
        rings.push(ring.clone());
        let se = SessionEventLoop {
            thread_name: format!("fuser-uring-{t}"),
            filesystem: filesystem.clone(),
            ch: dev.clone(),
            allowed,
            session_owner,
            spin: None,
            // A ring entry's payload is one buffer (the kernel's ABI).
            paged: false,
        };
        let tx = tx.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("fuser-uring-{t}"))
                .spawn(move || serve(&ring, &se, t, tx))?,
        );
    }
    drop(tx);
    let started = Rings {
        rings,
        threads: handles,
    };
    for r in rx.iter().take(threads) {
        if let Err(e) = r {
            started.stop_and_join();
            return Err(e);
        }
    }
    Ok(started)
}

fn serve<FS: Filesystem>(
    ring: &Arc<Ring>,
    se: &SessionEventLoop<FS>,
    cpu: usize,
    ready: std::sync::mpsc::Sender<io::Result<()>>,
) {
    pin_to_cpu(cpu);
    ON_RING.with(|r| r.set(Arc::as_ptr(ring)));
    let mut early = Vec::new();
    let registered = (|| -> io::Result<()> {
        for idx in 0..ring.entries.len() as u32 {
            ring.push(&ring.cmd(idx, CMD_REGISTER, 0))?;
        }
        let poll = opcode::PollAdd::new(types::Fd(ring.stop_fd.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(STOP);
        ring.push(&poll.into())?;
        ring.kick_poll()?;
        ring.uring.submitter().submit()?;
        // A register that fails completes at once (ENOTCONN, EOPNOTSUPP...);
        // one that succeeded completes only with a request, kept for below.
        // SAFETY: only this thread reads the completion queue.
        let cq = unsafe { ring.uring.completion_shared() };
        for c in cq {
            if c.result() < 0 && c.user_data() != STOP && c.user_data() != KICK {
                return Err(io::Error::from_raw_os_error(-c.result()));
            }
            early.push((c.user_data(), c.result()));
        }
        Ok(())
    })();
    let failed = registered.is_err();
    let _ = ready.send(registered);
    drop(ready);
    if failed {
        return;
    }
    let mut done = early;
    let mut dead = 0usize;
    loop {
        if done.is_empty() {
            if let Err(e) = ring.uring.submitter().submit_and_wait(1) {
                match e.raw_os_error() {
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY) => continue,
                    _ => {
                        error!("io_uring wait failed: {e}");
                        return;
                    }
                }
            }
            // SAFETY: only this thread reads the completion queue.
            done.extend(
                unsafe { ring.uring.completion_shared() }.map(|c| (c.user_data(), c.result())),
            );
        }
        for (ud, res) in done.drain(..) {
            if ud == STOP || ring.stopping.load(Ordering::Acquire) {
                return;
            }
            if ud == KICK {
                // The commits queued by other threads go out with the next
                // wait; drain the counter and watch for the next kick.
                let mut b = [0u8; 8];
                // SAFETY: reading 8 bytes from our non-blocking eventfd.
                unsafe { libc::read(ring.kick_fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
                if res >= 0 && ring.kick_poll().is_err() {
                    error!("io_uring: cannot watch for replies from other threads");
                }
                continue;
            }
            let idx = ud as u32;
            if res < 0 {
                match -res {
                    libc::EINTR | libc::EAGAIN => {
                        let st = ring.entries[idx as usize].state.lock();
                        let _ = ring.commit(idx, st.commit_id);
                    }
                    libc::ENOTCONN => {
                        dead += 1;
                        if dead == ring.entries.len() {
                            return;
                        }
                    }
                    e => {
                        warn!("io_uring entry {idx} failed: errno {e}");
                        dead += 1;
                        if dead == ring.entries.len() {
                            return;
                        }
                    }
                }
                continue;
            }
            handle(ring, se, idx);
        }
    }
}

/// Rebuilds the request in front of its payload and dispatches it.
fn handle<FS: Filesystem>(ring: &Arc<Ring>, se: &SessionEventLoop<FS>, idx: u32) {
    let e = &ring.entries[idx as usize];
    // SAFETY: the completion handed the buffers to us; the kernel wrote them
    // before posting it.
    let header = unsafe { &*e.header };
    let inout = header.ent_in_out;
    let len = u32::from_ne_bytes(header.in_out[0..4].try_into().unwrap()) as usize;
    let payload_sz = inout.payload_sz as usize;
    let op_sz = len.wrapping_sub(IN_HEADER_SZ + payload_sz);
    let unique = u64::from_ne_bytes(header.in_out[8..16].try_into().unwrap());
    {
        let mut st = e.state.lock();
        st.commit_id = inout.commit_id;
        st.mode = if payload_sz > 0 {
            ReplyMode::Stage(None)
        } else {
            ReplyMode::Direct
        };
    }
    let sender = UringSender {
        ring: ring.clone(),
        idx,
    };
    let valid =
        len >= IN_HEADER_SZ + payload_sz && op_sz <= OP_IN_SZ && payload_sz <= e.payload_cap();
    if valid {
        let start = HEADROOM - IN_HEADER_SZ - op_sz;
        // SAFETY: the headroom is ours (only requests live there) and does
        // not overlap the header buffer.
        let data = unsafe {
            std::ptr::copy_nonoverlapping(header.in_out.as_ptr(), e.buf.add(start), IN_HEADER_SZ);
            std::ptr::copy_nonoverlapping(
                header.op_in.as_ptr(),
                e.buf.add(start + IN_HEADER_SZ),
                op_sz,
            );
            std::slice::from_raw_parts(e.buf.add(start), len)
        };
        match RequestWithSender::new_uring(ring.dev.sender(), sender, data) {
            Some(req) => {
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<ReplyEmpty>().ok();
                } else {
                    req.dispatch(se);
                }
            }
            None => reply_error(ring, idx, unique),
        }
    } else {
        error!("io_uring request with len {len}, payload {payload_sz}: malformed");
        reply_error(ring, idx, unique);
    }
    // Dispatch is over: a staged reply goes out now, later ones directly.
    let mut st = e.state.lock();
    if let ReplyMode::Stage(staged) = std::mem::replace(&mut st.mode, ReplyMode::Direct) {
        if let Some(v) = staged {
            // SAFETY: the request's borrow of the payload ended with dispatch.
            unsafe { e.write_reply(&[IoSlice::new(&v)]) };
            let _ = ring.commit(idx, st.commit_id);
        }
    }
}

fn reply_error(ring: &Arc<Ring>, idx: u32, unique: u64) {
    let mut out = [0u8; OUT_HEADER_SZ];
    out[0..4].copy_from_slice(&(OUT_HEADER_SZ as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
    out[8..16].copy_from_slice(&unique.to_ne_bytes());
    let _ = UringSender {
        ring: ring.clone(),
        idx,
    }
    .send(&[IoSlice::new(&out)]);
}
