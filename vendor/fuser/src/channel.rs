use std::io;
use std::os::fd::AsFd;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use nix::errno::Errno;

use crate::dev_fuse::DevFuse;
use crate::passthrough::BackingId;

/// A raw communication channel to the FUSE kernel driver
#[derive(Debug, Clone)]
pub(crate) struct Channel(Arc<DevFuse>);

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Channel {
    /// Create a new communication channel to the kernel driver by mounting the
    /// given path. The kernel driver will delegate filesystem operations of
    /// the given path to the channel.
    pub(crate) fn new(device: Arc<DevFuse>) -> Self {
        Self(device)
    }

    /// Receives data up to the capacity of the given buffer (can block).
    pub(crate) fn receive(&self, buffer: &mut [u8]) -> nix::Result<usize> {
        nix::unistd::read(&self.0, buffer)
    }

    /// Receives data up to the capacity of the given buffer (can block),
    /// retrying on errors that are safe to retry (ENOENT, EINTR, EAGAIN).
    ///
    /// - ENOENT: Operation interrupted. According to FUSE, this is safe to retry.
    /// - EINTR: Interrupted system call, retry.
    /// - EAGAIN: Explicitly instructed to try again.
    pub(crate) fn receive_retrying(&self, buffer: &mut [u8]) -> nix::Result<usize> {
        loop {
            match self.receive(buffer) {
                Ok(size) => return Ok(size),
                Err(Errno::ENOENT | Errno::EINTR | Errno::EAGAIN) => continue,
                Err(err) => return Err(err),
            }
        }
    }

    /// memfs patch: makes reads of this descriptor non-blocking
    /// (`/dev/fuse` honours `O_NONBLOCK` per open file, not `RWF_NOWAIT`).
    fn set_nonblocking(&self) -> nix::Result<()> {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let flags = OFlag::from_bits_truncate(fcntl(&self.0, FcntlArg::F_GETFL)?);
        fcntl(&self.0, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map(drop)
    }

    /// Returns a sender object for this channel. The sender object can be
    /// used to send to the channel. Multiple sender objects can be used
    /// and they can safely be sent to other threads.
    pub(crate) fn sender(&self) -> ChannelSender {
        // Since write/writev syscalls are threadsafe, we can simply create
        // a sender by using the same file and use it in other threads.
        ChannelSender(self.0.clone())
    }

    /// Clone the FUSE device fd using FUSE_DEV_IOC_CLONE ioctl.
    ///
    /// This creates a new fd that can read FUSE requests independently,
    /// enabling true parallel request processing. The kernel distributes
    /// requests across all cloned fds.
    ///
    /// Requires Linux 4.5+. Returns an error on older kernels or non-Linux.
    #[cfg(target_os = "linux")]
    pub(crate) fn clone_fd(&self) -> io::Result<Channel> {
        use std::os::fd::AsRawFd;

        let new_dev = DevFuse::open()?;

        let mut source_fd = self.0.as_raw_fd() as u32;
        // SAFETY: fuse_dev_ioc_clone is a valid ioctl for /dev/fuse
        unsafe {
            crate::ll::ioctl::fuse_dev_ioc_clone(new_dev.as_raw_fd(), &mut source_fd)?;
        }

        Ok(Channel::new(Arc::new(new_dev)))
    }
}

#[derive(Clone, Debug)]
pub(crate) struct ChannelSender(Arc<DevFuse>);

impl ChannelSender {
    pub(crate) fn send(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<()> {
        let rc = nix::sys::uio::writev(&self.0, bufs)?;
        // writev is atomic, so do not need to check how many bytes are written.
        // libfuse does not do it either
        // https://github.com/libfuse/libfuse/blob/6278995cca991978abd25ebb2c20ebd3fc9e8a13/lib/fuse_lowlevel.c#L267
        debug_assert_eq!(bufs.iter().map(|b| b.len()).sum::<usize>(), rc);
        Ok(())
    }

    pub(crate) fn open_backing(&self, fd: BorrowedFd<'_>) -> std::io::Result<BackingId> {
        BackingId::create(&self.0, fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        unsafe { BackingId::wrap_raw(&self.0, id) }
    }
}

/// memfs patch: lets one worker at a time poll `/dev/fuse` for a while
/// before it sleeps (`Config::spin_poll`).
///
/// Why: a request that finds every worker asleep in `read` wakes one of them,
/// usually on the other CPU, and on an idle VM that CPU has halted: the
/// wake-up is an inter-processor interrupt plus a halt exit, tens of µs,
/// more than the request itself. A worker that is still polling takes the
/// request with no wake-up. Only one polls, so the others' CPUs stay free for
/// the callers; the poll ends after the budget, so an idle mount costs no CPU.
///
/// The poller reads from a clone of the device of its own, opened
/// non-blocking once, so that no worker switches its descriptor's mode per
/// request; a reply goes to the clone that read its request (the kernel
/// looks the request up in that clone's processing queue).
#[derive(Debug)]
pub(crate) struct Poller {
    busy: AtomicBool,
    budget: Duration,
    ch: Channel,
}

impl Poller {
    pub(crate) fn new(ch: &Channel, budget: Duration) -> io::Result<Self> {
        let ch = ch.clone_fd()?;
        ch.set_nonblocking()?;
        Ok(Self::with_channel(ch, budget))
    }

    /// A poller reading `ch`, which must be non-blocking.
    fn with_channel(ch: Channel, budget: Duration) -> Self {
        Self {
            busy: AtomicBool::new(false),
            budget,
            ch,
        }
    }

    /// Whether polling is worth it after a request that took `work` to
    /// serve, `data` if it was a READ or a WRITE. A wake-up costs about as
    /// much as the budget; after longer data work (a 1 MiB copy) it is a
    /// small share of the next request's time, while a polling thread keeps
    /// its CPU looking busy, so the scheduler does not move a waiting caller
    /// there: measured, polling after 1 MiB requests lost 10-20 % of fio's
    /// 1 MiB throughput. Any other request polls after, however long it
    /// took: a long one there is a tree waiting on its network (a volume's
    /// CREATE waits a script's round trip, its CPU idle), and the caller's
    /// next request (the FLUSH of a create's close) comes right after the
    /// reply. Measured on a volume mount, a create and its close in rounds
    /// of 2,000, alternating binaries: medians 462 against 420 µs (four
    /// rounds), then 371 against 366 µs (six): a small gain, near this
    /// machine's noise (docs/cluster.md, "Measured"). The local engine's
    /// requests other than data copies take under the budget, so for it
    /// nothing changes.
    pub(crate) fn pays_after(&self, work: Duration, data: bool) -> bool {
        !data || work < self.budget
    }

    /// The channel that polled requests are read from and answered on.
    pub(crate) fn channel(&self) -> &Channel {
        &self.ch
    }

    /// Polls for the next request unless another worker polls now. `None`:
    /// nothing came within the budget, or another worker is polling; the
    /// caller then sleeps in a blocking read of its own channel.
    #[cfg(test)]
    pub(crate) fn poll(&self, buffer: &mut [u8]) -> Option<nix::Result<usize>> {
        self.poll_with(|ch| ch.receive(buffer))
    }

    /// [`Poller::poll`] with the read given: `receive` reads one request
    /// from the channel it is given (non-blocking).
    pub(crate) fn poll_with<T>(
        &self,
        mut receive: impl FnMut(&Channel) -> nix::Result<T>,
    ) -> Option<nix::Result<T>> {
        if self.busy.swap(true, Ordering::Acquire) {
            return None;
        }
        // The clock is read only once the device was found empty: under a
        // deep queue the first read finds a request.
        let mut deadline = None;
        let polled = loop {
            match receive(&self.ch) {
                Ok(size) => break Some(Ok(size)),
                Err(Errno::EAGAIN) => {
                    let now = Instant::now();
                    if now >= *deadline.get_or_insert(now + self.budget) {
                        break None;
                    }
                    // Yield to whatever else wants this CPU (a woken
                    // worker, the caller): the poll is for idle CPUs only.
                    std::thread::yield_now();
                }
                Err(Errno::ENOENT | Errno::EINTR) => {}
                Err(err) => break Some(Err(err)),
            }
        };
        self.busy.store(false, Ordering::Release);
        polled
    }
}

#[cfg(test)]
mod test {
    use std::fs::File;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use std::time::Instant;

    use super::Channel;
    use super::Poller;
    use crate::dev_fuse::DevFuse;

    /// A poller over a pipe: `/dev/fuse` and a pipe both answer a
    /// non-blocking read with EAGAIN when nothing is queued.
    fn poller(budget: Duration) -> (Poller, std::os::fd::OwnedFd) {
        let (r, w) = nix::unistd::pipe().unwrap();
        let ch = Channel::new(Arc::new(DevFuse(File::from(r))));
        ch.set_nonblocking().unwrap();
        (Poller::with_channel(ch, budget), w)
    }

    #[test]
    fn poller_gives_up_after_its_budget_and_takes_what_is_queued() {
        let budget = Duration::from_millis(20);
        let (p, w) = poller(budget);
        let mut buf = [0u8; 16];
        let started = Instant::now();
        assert!(p.poll(&mut buf).is_none(), "nothing queued");
        assert!(started.elapsed() >= budget, "gave up early");
        assert!(!p.busy.load(Ordering::Relaxed), "the token is released");

        nix::unistd::write(&w, b"req").unwrap();
        assert_eq!(p.poll(&mut buf).unwrap().unwrap(), 3);
        assert_eq!(&buf[..3], b"req");

        // Only one worker polls: another one goes to sleep at once, and the
        // request stays queued for whoever reads next.
        nix::unistd::write(&w, b"next").unwrap();
        p.busy.store(true, Ordering::Relaxed);
        assert!(p.poll(&mut buf).is_none());
        p.busy.store(false, Ordering::Relaxed);
        assert_eq!(p.poll(&mut buf).unwrap().unwrap(), 4);

        // A closed pipe ends the poll at once (a read of 0 bytes).
        drop(w);
        assert_eq!(p.poll(&mut buf).unwrap().unwrap(), 0, "end of file");
    }

    #[test]
    fn poller_takes_a_request_that_arrives_while_it_polls() {
        // A budget far longer than the test: the poll can only end by
        // taking the request.
        let (p, w) = poller(Duration::from_secs(600));
        let writer = std::thread::spawn(move || {
            nix::unistd::write(&w, b"late").unwrap();
            w
        });
        let mut buf = [0u8; 16];
        assert_eq!(p.poll(&mut buf).unwrap().unwrap(), 4);
        assert_eq!(&buf[..4], b"late");
        drop(writer.join().unwrap());
    }

    #[test]
    fn polling_pays_after_short_data_work_and_after_any_other() {
        let (p, _w) = poller(Duration::from_micros(50));
        assert!(p.pays_after(Duration::ZERO, true));
        assert!(p.pays_after(Duration::from_micros(49), true));
        assert!(!p.pays_after(Duration::from_micros(50), true));
        assert!(!p.pays_after(Duration::from_millis(1), true));
        // A request that is not a data copy: its time was a wait.
        assert!(p.pays_after(Duration::from_millis(1), false));
    }
}
