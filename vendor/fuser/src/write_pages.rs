//! memfs patch: WRITE data read from the kernel straight into page-sized
//! allocations that the file system may keep (`Config::paged_writes`).
//!
//! Why: a WRITE's data is otherwise copied twice in the server, by the
//! kernel into the worker's request buffer and then by the file system into
//! its own pages. Reading each request with `readv` into the request header
//! followed by separate 4 KiB pages puts a page-aligned WRITE's data into
//! pages the file system can adopt as they are (docs/fuse.md, "Copies per
//! byte"). Requests other than WRITE that are longer than the header are
//! copied back behind it, so that they parse from one buffer as before; they
//! are small (names, xattr values).

use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;

use crate::channel::Channel;
use crate::ll::fuse_abi as abi;

/// Size of one page of WRITE data.
pub const PAGE_SIZE: usize = 4096;

/// One page of a WRITE's data: an allocation the file system may keep.
pub type Page = Box<[u8; PAGE_SIZE]>;

/// Bytes in front of a WRITE's data: `fuse_in_header` and `fuse_write_in`.
pub(crate) const WRITE_HEAD: usize =
    size_of::<abi::fuse_in_header>() + size_of::<abi::fuse_write_in>();

/// WRITEs of at least this many bytes switch a worker to reading into
/// pages. Reading into 257 buffers costs the kernel a copy of the buffer
/// list per request (4 KiB): on 4 KiB direct I/O that cost more than the
/// one page copy it saves (~10 % fewer requests/s, docs/fuse.md).
const LARGE_WRITE: usize = 64 * 1024;

/// Requests after the last large WRITE for which a worker keeps reading
/// into pages: a mixed read/write stream of large requests stays paged.
const WARM_REQUESTS: u32 = 64;

/// A page as the kernel is to fill it: not initialised until then. Zeroing
/// each fresh page (calloc) cost about as much as the copy this saves
/// (docs/fuse.md, "Copies per byte").
type RawPage = Box<MaybeUninit<[u8; PAGE_SIZE]>>;

/// The data of one WRITE request, in pages: page `i` holds bytes
/// `[i * PAGE_SIZE, (i + 1) * PAGE_SIZE)` of the data (the last one fewer,
/// and zeros after them).
#[derive(Debug)]
pub struct WritePages {
    /// Every page a request can fill; a taken page is `None` until the next
    /// request is read. Invariant: `pages[..len.div_ceil(PAGE_SIZE)]` are
    /// initialised (filled by the kernel; the last one's tail zeroed).
    pages: Vec<Option<RawPage>>,
    /// Bytes of data in the current WRITE; 0 when the request was not one.
    len: usize,
    /// The read's buffers: the header, then each page. Kept from read to
    /// read (a vector of 258 rebuilt per request cost 4k requests ~10 %).
    iov: Vec<libc::iovec>,
    /// Leading pages the file system may have taken or swapped since the
    /// last read (those `pages_mut` handed out): their `iov` entries are
    /// renewed before the next.
    stale: usize,
    /// Requests left to read into pages (`WARM_REQUESTS` after each large
    /// WRITE); at 0 requests are read into the header buffer alone.
    warm: u32,
}

impl WritePages {
    /// Room for a request of `max` bytes behind a write header.
    pub(crate) fn new(max: usize) -> Self {
        let n = max.saturating_sub(WRITE_HEAD).div_ceil(PAGE_SIZE).max(1);
        let mut pages: Vec<Option<RawPage>> = (0..n).map(|_| Some(Box::new_uninit())).collect();
        let mut iov = Vec::with_capacity(n + 1);
        iov.push(libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: WRITE_HEAD,
        });
        for p in &mut pages {
            iov.push(libc::iovec {
                iov_base: p.as_mut().expect("just made").as_mut_ptr().cast(),
                iov_len: PAGE_SIZE,
            });
        }
        Self {
            pages,
            len: 0,
            iov,
            stale: 0,
            warm: 0,
        }
    }

    /// Bytes of data.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no data.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pages that hold the data, in order. A page the file system takes
    /// (`Option::take`) is its own; the others are reused.
    pub fn pages_mut(&mut self) -> &mut [Option<Page>] {
        let n = self.len.div_ceil(PAGE_SIZE);
        self.stale = self.stale.max(n);
        let init = &mut self.pages[..n];
        // SAFETY: these pages are initialised (the invariant on `pages`), and
        // `Option<Box<MaybeUninit<T>>>` has the layout of `Option<Box<T>>`
        // (`MaybeUninit<T>` has `T`'s; a `Box` of either is one non-null
        // pointer, `None` the null one). Whatever the caller stores back
        // through the result is an initialised page.
        unsafe { &mut *(init as *mut [Option<RawPage>] as *mut [Option<Page>]) }
    }

    /// The data as slices, in order: whole pages and a shorter last one.
    ///
    /// # Panics
    /// If a page holding data was taken.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        let len = self.len;
        self.pages[..len.div_ceil(PAGE_SIZE)]
            .iter()
            .enumerate()
            .map(move |(i, p)| {
                let p = p.as_ref().expect("page not taken");
                // SAFETY: the data's pages are initialised (the invariant on
                // `pages`).
                let p = unsafe { p.assume_init_ref() };
                &p[..(len - i * PAGE_SIZE).min(PAGE_SIZE)]
            })
    }

    /// The data in one buffer (a copy).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for s in self.slices() {
            v.extend_from_slice(s);
        }
        v
    }

    /// Reads the next request: its first [`WRITE_HEAD`] bytes into `head`,
    /// the rest into the pages, while large WRITEs come (`LARGE_WRITE`),
    /// else all of it into `head`. Returns the request's size and whether
    /// it is a WRITE whose data is now in the pages (`head[WRITE_HEAD..size]`
    /// is then left as it was). Any other request ends up whole in
    /// `head[..size]`, which must be as long as the longest request.
    pub(crate) fn receive(&mut self, ch: &Channel, head: &mut [u8]) -> nix::Result<(usize, bool)> {
        self.len = 0;
        assert!(head.len() >= WRITE_HEAD, "room for a write header");
        if self.warm == 0 {
            let size = ch.receive(head)?;
            if size >= WRITE_HEAD + LARGE_WRITE
                && opcode(head) == abi::fuse_opcode::FUSE_WRITE as u32
            {
                self.warm = WARM_REQUESTS;
            }
            return Ok((size, false));
        }
        self.warm -= 1;
        self.iov[0].iov_base = head.as_mut_ptr().cast();
        for (p, v) in self.pages[..self.stale].iter_mut().zip(&mut self.iov[1..]) {
            v.iov_base = p.get_or_insert_with(Box::new_uninit).as_mut_ptr().cast();
        }
        self.stale = 0;
        // SAFETY: `iov[0]` points at `head`, which this call borrows
        // mutably, for `WRITE_HEAD` bytes (asserted above); `iov[i + 1]` at
        // `pages[i]`, a page `self` owns (renewed above for every page that
        // may have been taken or swapped since), for its `PAGE_SIZE` bytes.
        // The kernel only writes into them; nothing reads the pages' bytes
        // until the count returned says they were written.
        let size = nix::errno::Errno::result(unsafe {
            libc::readv(
                ch.as_fd().as_raw_fd(),
                self.iov.as_ptr(),
                self.iov.len() as libc::c_int,
            )
        })? as usize;
        if size <= WRITE_HEAD {
            return Ok((size, false));
        }
        let body = size - WRITE_HEAD;
        if opcode(head) == abi::fuse_opcode::FUSE_WRITE as u32 {
            if body >= LARGE_WRITE {
                self.warm = WARM_REQUESTS;
            }
            // Zeros after the data in its last page make every page of it
            // initialised (the invariant on `pages`).
            let end = body % PAGE_SIZE;
            if end != 0 {
                let last = self.pages[body / PAGE_SIZE].as_mut().expect("filled");
                // SAFETY: `end..PAGE_SIZE` lies within the page.
                unsafe {
                    last.as_mut_ptr()
                        .cast::<u8>()
                        .add(end)
                        .write_bytes(0, PAGE_SIZE - end)
                };
            }
            self.len = body;
            return Ok((size, true));
        }
        // Not a WRITE: put the rest behind the header.
        assert!(head.len() >= size, "room for the longest request");
        for (i, p) in self.pages[..body.div_ceil(PAGE_SIZE)].iter().enumerate() {
            let n = (body - i * PAGE_SIZE).min(PAGE_SIZE);
            let at = WRITE_HEAD + i * PAGE_SIZE;
            let p = p.as_ref().expect("filled");
            // SAFETY: the kernel wrote the first `n` bytes of this page (it
            // fills the buffers in order, `size` bytes in all); the target
            // range lies within `head` (asserted above) and is another
            // allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    p.as_ptr().cast::<u8>(),
                    head[at..at + n].as_mut_ptr(),
                    n,
                )
            };
        }
        Ok((size, false))
    }
}

/// The opcode of the request whose header starts `head`.
pub(crate) fn opcode(head: &[u8]) -> u32 {
    u32::from_ne_bytes(head[4..8].try_into().expect("a header"))
}

#[cfg(test)]
mod test {
    use std::fs::File;
    use std::sync::Arc;

    use super::*;
    use crate::dev_fuse::DevFuse;

    /// A channel over a pipe: a pipe's `readv` fills the buffers in order,
    /// as `/dev/fuse` does with one request.
    fn pipe() -> (Channel, std::os::fd::OwnedFd) {
        let (r, w) = nix::unistd::pipe().unwrap();
        // Room for a whole large request: a write never waits for a reader.
        nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20)).unwrap();
        (Channel::new(Arc::new(DevFuse(File::from(r)))), w)
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    fn request(opcode: u32, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        let len = (WRITE_HEAD + body.len()) as u32;
        v.extend_from_slice(&len.to_ne_bytes());
        v.extend_from_slice(&opcode.to_ne_bytes());
        v.resize(WRITE_HEAD, 7);
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn a_write_lands_in_pages_and_other_requests_in_the_head() {
        let (ch, w) = pipe();
        let mut pages = WritePages::new(3 * PAGE_SIZE + WRITE_HEAD);
        pages.warm = WARM_REQUESTS;
        let mut head = vec![0u8; 4 * PAGE_SIZE];

        // A WRITE of 2.5 pages: its data in the pages, none in the head.
        let data: Vec<u8> = (0..PAGE_SIZE * 5 / 2).map(|i| (i % 251) as u8).collect();
        let req = request(abi::fuse_opcode::FUSE_WRITE as u32, &data);
        nix::unistd::write(&w, &req).unwrap();
        let (size, paged) = pages.receive(&ch, &mut head).unwrap();
        assert_eq!((size, paged), (req.len(), true));
        assert_eq!(pages.len(), data.len());
        assert_eq!(pages.to_vec(), data);
        assert_eq!(pages.pages_mut().len(), 3);
        let last = pages.pages_mut()[2].as_ref().unwrap();
        assert_eq!(&last[..PAGE_SIZE / 2], &data[2 * PAGE_SIZE..]);
        assert!(
            last[PAGE_SIZE / 2..].iter().all(|&b| b == 0),
            "zeros after the data"
        );
        assert!(
            head[WRITE_HEAD..size].iter().all(|&b| b == 0),
            "head untouched"
        );
        let taken = pages.pages_mut()[0].take().unwrap();
        assert_eq!(&taken[..], &data[..PAGE_SIZE]);

        // A LOOKUP after it: whole in the head; the taken page is replaced.
        let name = b"a-name-longer-than-nothing\0";
        let req = request(abi::fuse_opcode::FUSE_LOOKUP as u32, name);
        nix::unistd::write(&w, &req).unwrap();
        let (size, paged) = pages.receive(&ch, &mut head).unwrap();
        assert_eq!((size, paged), (req.len(), false));
        assert_eq!(&head[..size], &req[..]);
        assert!(pages.is_empty());
        assert!(pages.pages.iter().all(Option::is_some));

        // A request no longer than the head alone.
        let req = request(abi::fuse_opcode::FUSE_STATFS as u32, b"");
        nix::unistd::write(&w, &req).unwrap();
        assert_eq!(pages.receive(&ch, &mut head).unwrap(), (req.len(), false));
        assert_eq!(&head[..req.len()], &req[..]);
    }

    #[test]
    fn a_large_write_turns_pages_on_and_small_requests_turn_them_off() {
        let (ch, w) = pipe();
        let max = LARGE_WRITE + WRITE_HEAD;
        let mut pages = WritePages::new(max);
        let mut head = vec![0u8; max];
        let small = request(abi::fuse_opcode::FUSE_WRITE as u32, &[5; PAGE_SIZE]);
        let large = request(abi::fuse_opcode::FUSE_WRITE as u32, &bytes(LARGE_WRITE));

        // Cold: a small write is read into the head, and so is the first
        // large one, which warms the reader up.
        for req in [&small, &large] {
            nix::unistd::write(&w, req).unwrap();
            assert_eq!(pages.receive(&ch, &mut head).unwrap(), (req.len(), false));
            assert_eq!(&head[..req.len()], &req[..]);
        }
        // Warm: writes land in pages, until WARM_REQUESTS requests without
        // a large one have passed.
        for i in 0..WARM_REQUESTS {
            nix::unistd::write(&w, &small).unwrap();
            assert_eq!(
                pages.receive(&ch, &mut head).unwrap(),
                (small.len(), true),
                "request {i}"
            );
            assert_eq!(pages.to_vec(), vec![5; PAGE_SIZE]);
        }
        nix::unistd::write(&w, &small).unwrap();
        assert_eq!(
            pages.receive(&ch, &mut head).unwrap(),
            (small.len(), false),
            "cold again"
        );
    }
}
